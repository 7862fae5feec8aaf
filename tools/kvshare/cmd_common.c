/* SPDX-License-Identifier: Apache-2.0 */
#include "cmd_common.h"

#include <langinfo.h>
#include <locale.h>
#include <stdlib.h>
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

/* The system daemon's socket: where the packages' unit (RuntimeDirectory
 * kvshare) and the Kubernetes DaemonSet put it. A test build names another
 * (tools/kvshare/CMakeLists.txt). */
#ifndef KVSHARE_SYSTEM_SOCKET
#define KVSHARE_SYSTEM_SOCKET "/run/kvshare/kvshared.sock"
#endif

int cli_socket_paths(const cli_conn_t *conn, char paths[CLI_MAX_PATHS][CLI_PATH_LEN])
{
    if (conn->socket_path) {
        snprintf(paths[0], CLI_PATH_LEN, "%s", conn->socket_path);
        return 1;
    }
    if (kvs_default_socket_path(paths[0], CLI_PATH_LEN) != 0)
        return 0;
    const char *env = getenv("KVSHARE_SOCKET");
    if ((env && env[0]) || strcmp(paths[0], KVSHARE_SYSTEM_SOCKET) == 0)
        return 1;
    snprintf(paths[1], CLI_PATH_LEN, "%s", KVSHARE_SYSTEM_SOCKET);
    return 2;
}

kvs_client_t *cli_connect_path(const cli_conn_t *conn, const char *path, const char *worker)
{
    kvs_options_t o;
    kvs_client_t *c = NULL;
    kvs_options_init(&o);
    o.socket_path = path;
    o.timeout_ms = conn->timeout_ms > 0 ? conn->timeout_ms : 2000;
    o.worker_name = worker;
    /* Lazy, so that a failed connect still explains itself in kvs_last_error. */
    o.flags = KVS_NO_MAP | KVS_LAZY;
    return kvs_connect(&o, &c) == 0 ? c : NULL;
}

kvs_client_t *cli_connect(const cli_conn_t *conn, const char *cmd)
{
    char paths[CLI_MAX_PATHS][CLI_PATH_LEN];
    char why[CLI_MAX_PATHS][256];
    int n = cli_socket_paths(conn, paths);
    if (n == 0) {
        fprintf(stderr, "kvshare %s: cannot build the default socket path; give --socket PATH\n",
                cmd);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        kvs_client_t *c = cli_connect_path(conn, paths[i], "kvshare-cli");
        if (!c) {
            fprintf(stderr, "kvshare %s: %s\n", cmd, kvs_strerror(KVS_ENOMEM));
            return NULL;
        }
        if (kvs_connected(c))
            return c;
        snprintf(why[i], sizeof(why[i]), "%s", kvs_last_error(c));
        kvs_close(c);
    }
    if (n == 1) {
        fprintf(stderr, "kvshare %s: %s\n", cmd, why[0]);
    } else {
        fprintf(stderr, "kvshare %s: no kvshared answers; tried:\n", cmd);
        for (int i = 0; i < n; i++)
            fprintf(stderr, "  %s: %s\n", paths[i], why[i]);
    }
    fprintf(stderr,
            "  (start kvshared, or point to its socket with --socket PATH or "
            "$KVSHARE_SOCKET%s%s)\n",
            conn->socket_path ? "" : "; default ", conn->socket_path ? "" : paths[0]);
    return NULL;
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
