/* SPDX-License-Identifier: Apache-2.0 */
/*
 * manpage: the man pages, written at build time from the tables the
 * programs run on, so that a page cannot fall behind its program:
 *
 *     manpage kvshared OUT          kvshared(8): its options and config keys
 *                                   from the settings table (settings_man)
 *     manpage kvshare KVSHARE OUT   kvshare(1): its commands from the command
 *                                   table (KVSHARE_COMMANDS), each with the
 *                                   --help text of the built program KVSHARE
 *
 * Exit status 0, or 1 with a message when OUT or KVSHARE fails.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvshare_version.h"
#include "settings.h"

#define STR2(x) #x
#define STR(x)  STR2(x)
#define VERSION STR(KVS_VERSION_MAJOR) "." STR(KVS_VERSION_MINOR) "." STR(KVS_VERSION_PATCH)

/* Text for roff, as settings_man writes it: \e for a backslash, \- for a
 * hyphen, and \& before a line's leading dot or quote. */
static void roff_line(FILE *f, const char *line, size_t len)
{
    if (len > 0 && (line[0] == '.' || line[0] == '\''))
        fputs("\\&", f);
    for (size_t i = 0; i < len; i++) {
        if (line[i] == '\\')
            fputs("\\e", f);
        else if (line[i] == '-')
            fputs("\\-", f);
        else
            fputc(line[i], f);
    }
    fputc('\n', f);
}

static void kvshared_page(FILE *f)
{
    fputs(".TH KVSHARED 8 \"\" \"kvshare " VERSION "\" \"System Administration\"\n"
          ".ad l\n"
          ".nh\n"
          ".SH NAME\n"
          "kvshared \\- node\\-local KV\\-cache prefix sharing daemon for LLM serving\n"
          ".SH SYNOPSIS\n"
          ".B kvshared\n"
          "[\\fIoptions\\fR]\n"
          ".br\n"
          ".B kvshared \\-\\-check\\-config\n"
          ".I FILE\n"
          ".SH DESCRIPTION\n"
          ".B kvshared\n"
          "holds the attention key/value blocks of the prompts that the serving\n"
          "engines on one node have computed, in one pool (GPU memory or host\n"
          "memory), indexed by token prefix.\n"
          "Engine workers on the node ask it over a Unix socket for the longest\n"
          "cached prefix of a new prompt and read those blocks instead of computing\n"
          "them again.\n"
          ".PP\n"
          "The packages' systemd unit runs\n"
          ".B kvshared \\-\\-config /etc/kvshare/kvshared.conf\n"
          "as the user kvshare, with its socket in /run/kvshare; members of the\n"
          "group kvshare may connect.\n"
          "Size the pool first\n"
          "(\\fBkvshare calc\\fR, then \\fBpool_bytes\\fR in the file), check the file with\n"
          "\\fBkvshared \\-\\-check\\-config\\fR, then \\fBsystemctl enable \\-\\-now "
          "kvshared\\fR.\n",
          f);
    settings_man(f);
    fputs(".SH SIGNALS\n"
          ".TP\n.B SIGHUP\n"
          "Reread the configuration file; the settings marked above take effect,\n"
          "the others at the next start.\n"
          ".TP\n.B SIGTERM\n"
          "Drain: stop accepting, answer what was asked, exit within\n"
          ".BR drain_timeout_ms .\n"
          ".SH FILES\n"
          ".TP\n.I /etc/kvshare/kvshared.conf\n"
          "The configuration of the packages' unit.\n"
          ".TP\n.I /run/kvshare/kvshared.sock\n"
          "The unit's socket (its RuntimeDirectory, mode 0750, group kvshare).\n"
          ".TP\n.I /usr/share/doc/kvshared/\n"
          "OPERATING.md (settings, metrics, alerts and their runbooks), RELIABILITY.md,\n"
          "CLUSTER.md, ENGINES.md, DEPLOYING.md.\n"
          ".SH SEE ALSO\n"
          ".BR kvshare (1)\n",
          f);
}

/* Each command's usage, as the built program prints it. */
static int command_help(FILE *f, const char *kvshare, const char *name)
{
    char cmd[4096], line[1024];
    snprintf(cmd, sizeof(cmd), "'%s' %s --help", kvshare, name);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    fputs(".PP\n.nf\n", f);
    while (fgets(line, sizeof(line), p)) {
        size_t len = strcspn(line, "\n");
        roff_line(f, line, len);
    }
    fputs(".fi\n", f);
    return pclose(p) == 0 ? 0 : -1;
}

#define COMMAND_ROW(name, fn, help) {#name, help},
static const struct {
    const char *name, *help;
} commands[] = {KVSHARE_COMMANDS(COMMAND_ROW)};
#undef COMMAND_ROW

static int kvshare_page(FILE *f, const char *kvshare)
{
    fputs(".TH KVSHARE 1 \"\" \"kvshare " VERSION "\" \"User Commands\"\n"
          ".ad l\n"
          ".nh\n"
          ".SH NAME\n"
          "kvshare \\- the command\\-line tool of the kvshared daemon\n"
          ".SH SYNOPSIS\n"
          ".B kvshare\n"
          ".I COMMAND\n"
          "[\\fIOPTIONS\\fR]\n"
          ".SH DESCRIPTION\n"
          ".B kvshare\n"
          "asks a running\n"
          ".BR kvshared (8)\n"
          "for its figures and views, drops cached blocks, and sizes a node's\n"
          "pool (\\fBcalc\\fR, which needs no daemon).\n"
          ".SH COMMANDS\n",
          f);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        fprintf(f, ".SS %s\n", commands[i].name);
        roff_line(f, commands[i].help, strlen(commands[i].help));
        if (command_help(f, kvshare, commands[i].name) != 0) {
            fprintf(stderr, "manpage: %s %s --help failed\n", kvshare, commands[i].name);
            return -1;
        }
    }
    fputs(".SH SOCKET\n"
          "The commands that talk to the daemon use\n"
          ".B \\-\\-socket\n"
          ".I PATH\n"
          "when given; else\n"
          ".B $KVSHARE_SOCKET\n"
          "when set; else\n"
          ".I $XDG_RUNTIME_DIR/kvshare/kvshared.sock\n"
          "(as root\n"
          ".IR /run/kvshare/kvshared.sock ,\n"
          "without XDG_RUNTIME_DIR\n"
          ".IR /tmp/kvshare\\-$UID/kvshared.sock ),\n"
          "and when no daemon answers there, the system daemon's\n"
          ".IR /run/kvshare/kvshared.sock ,\n"
          "which members of the group kvshare may use.\n"
          "When none answers, the error names each path tried.\n"
          ".SH EXIT STATUS\n"
          "0 success, 1 the operation failed (no daemon, say), 2 bad usage.\n"
          ".SH SEE ALSO\n"
          ".BR kvshared (8);\n"
          "/usr/share/doc/kvshared/OPERATING.md: the views of\n"
          ".B kvshare top\n"
          "and\n"
          ".BR \"kvshare tree\" ,\n"
          "and what to do when a figure looks wrong.\n",
          f);
    return 0;
}

int main(int argc, char **argv)
{
    bool daemon = argc == 3 && strcmp(argv[1], "kvshared") == 0;
    bool cli = argc == 4 && strcmp(argv[1], "kvshare") == 0;
    if (!daemon && !cli) {
        fprintf(stderr, "usage: manpage kvshared OUT | manpage kvshare KVSHARE OUT\n");
        return 2;
    }
    const char *out = argv[argc - 1];
    FILE *f = fopen(out, "w");
    if (!f) {
        perror(out);
        return 1;
    }
    int rc = 0;
    if (daemon)
        kvshared_page(f);
    else
        rc = kvshare_page(f, argv[2]);
    if (fclose(f) != 0 || rc != 0) {
        fprintf(stderr, "manpage: could not write %s\n", out);
        remove(out);
        return 1;
    }
    return 0;
}
