/* SPDX-License-Identifier: Apache-2.0 */
#include "cmd_common.h"

#include <langinfo.h>
#include <locale.h>
#include <string.h>

#include "units.h"

int cli_conn_flag(cli_conn_t *conn, int argc, char **argv, int *i, const char *cmd)
{
    const char *flag = argv[*i];
    if (strcmp(flag, "--socket") != 0 && strcmp(flag, "--timeout") != 0)
        return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvshare %s: %s needs a value\n", cmd, flag);
        return -1;
    }
    const char *v = argv[++*i];
    if (strcmp(flag, "--socket") == 0) {
        conn->socket_path = v;
        return 1;
    }
    uint64_t ms;
    if (units_parse_ms(v, 1, &ms) != 0 || ms == 0 || ms > 3600000) {
        fprintf(stderr,
                "kvshare %s: --timeout takes 1ms to 1h (a bare number is milliseconds), not "
                "'%s'\n",
                cmd, v);
        return -1;
    }
    conn->timeout_ms = (int)ms;
    return 1;
}

kvs_client_t *cli_connect(const cli_conn_t *conn, const char *cmd)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = conn->socket_path;
    o.timeout_ms = conn->timeout_ms > 0 ? conn->timeout_ms : 2000;
    o.worker_name = "kvshare-cli";
    /* Lazy, so that a failed connect still explains itself in kvs_last_error. */
    o.flags = KVS_NO_MAP | KVS_LAZY;
    int rc = kvs_connect(&o, &c);
    if (rc != 0) {
        fprintf(stderr, "kvshare %s: %s\n", cmd, kvs_strerror(rc));
        return NULL;
    }
    if (!kvs_connected(c)) {
        char path[256] = "";
        if (!conn->socket_path)
            kvs_default_socket_path(path, sizeof(path));
        fprintf(stderr, "kvshare %s: %s\n", cmd, kvs_last_error(c));
        fprintf(stderr,
                "  (start kvshared, or point to its socket with --socket PATH or "
                "$KVSHARE_SOCKET%s%s)\n",
                path[0] ? "; default " : "", path);
        kvs_close(c);
        return NULL;
    }
    return c;
}

void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

int cli_utf8(void)
{
    static int known = -1;
    if (known < 0) {
        /* LC_CTYPE only: number formatting (LC_NUMERIC) stays "C". */
        setlocale(LC_CTYPE, "");
        const char *set = nl_langinfo(CODESET);
        known = set && (strcmp(set, "UTF-8") == 0 || strcmp(set, "utf8") == 0);
    }
    return known;
}
