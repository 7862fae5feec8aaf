/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare sessions: the workers connected to kvshared, one row each, as
 * Redis's CLIENT LIST: id, peer pid and uid, worker name, namespaces, pins,
 * WRITING blocks, bytes buffered, age, idle time and hold; --json for
 * scripts. This command's own connection is one of the rows.
 */
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare sessions [--json] [--socket PATH] [--timeout MS]\n"
               "\n"
               "The clients connected to kvshared, newest first (this command's own\n"
               "connection included): session id, peer pid and uid, worker name (from\n"
               "Hello), distinct blocks pinned, WRITING blocks held, bytes buffered (input\n"
               "and output), seconds since it connected (AGE) and since its last request\n"
               "(IDLE), whether its next request waits (HELD, and why), and the namespaces\n"
               "it uses (of the blocks it pins, and the dynamic ones it created).\n");
}

static void print_json(FILE *f, const kvs_session_info_t *s, size_t n)
{
    fprintf(f, "{\"sessions\":[");
    for (size_t i = 0; i < n; i++) {
        const kvs_session_info_t *r = &s[i];
        fprintf(f, "%s{\"id\":%llu,\"pid\":%d,\"uid\":%u,\"worker\":", i ? "," : "",
                (unsigned long long)r->id, (int)r->pid, r->uid);
        cli_json_string(f, r->worker);
        fprintf(f, ",\"namespaces\":[");
        for (size_t j = 0; j < r->n_namespaces; j++) {
            if (j)
                fputc(',', f);
            cli_json_string(f, r->namespaces[j]);
        }
        fprintf(f,
                "],\"pins\":%u,\"pins_total\":%llu,\"writing\":%u,\"buffered_bytes\":%llu,"
                "\"age_s\":%llu,\"idle_s\":%llu,\"requests\":%llu,\"held\":%s,\"held_for\":",
                r->pins, (unsigned long long)r->pins_total, r->writing,
                (unsigned long long)r->buffered, (unsigned long long)r->age_s,
                (unsigned long long)r->idle_s, (unsigned long long)r->requests,
                r->held ? "true" : "false");
        cli_json_string(f, r->held_for);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
}

static void print_table(FILE *f, const kvs_session_info_t *s, size_t n)
{
    int wname = 6; /* "WORKER" */
    for (size_t i = 0; i < n; i++) {
        int len = (int)strlen(s[i].worker);
        if (len > wname)
            wname = len;
    }
    char b[32];
    fprintf(f, "%6s %8s %6s  %-*s %7s %7s %10s %7s %7s  %-10s %s\n", "ID", "PID", "UID", wname,
            "WORKER", "PINS", "WRITING", "BUFFERED", "AGE", "IDLE", "HELD", "NAMESPACES");
    for (size_t i = 0; i < n; i++) {
        const kvs_session_info_t *r = &s[i];
        char held[24];
        snprintf(held, sizeof(held), "%s", r->held ? (r->held_for[0] ? r->held_for : "yes") : "-");
        fprintf(f, "%6llu %8d %6u  %-*s %7u %7u %10s %7llu %7llu  %-10s ",
                (unsigned long long)r->id, (int)r->pid, r->uid, wname,
                r->worker[0] ? r->worker : "-", r->pins, r->writing,
                units_format_bytes(r->buffered, 1, b, sizeof(b)), (unsigned long long)r->age_s,
                (unsigned long long)r->idle_s, held);
        if (r->n_namespaces == 0)
            fputc('-', f);
        for (size_t j = 0; j < r->n_namespaces; j++)
            fprintf(f, "%s%s", j ? "," : "", r->namespaces[j]);
        fputc('\n', f);
    }
}

int kvshare_cmd_sessions(int argc, char **argv)
{
    cli_conn_t conn = {0};
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "sessions");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare sessions: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    kvs_client_t *c = cli_connect(&conn, "sessions");
    if (!c)
        return 1;
    kvs_session_info_t *rows = NULL;
    size_t n = 0;
    int rc = kvs_sessions(c, &rows, &n);
    if (rc == KVS_EPROTO)
        fprintf(stderr, "kvshare sessions: this kvshared is older and cannot list sessions (%s)\n",
                kvs_last_error(c));
    else if (rc != 0)
        fprintf(stderr, "kvshare sessions: %s\n", kvs_last_error(c));
    else if (json)
        print_json(stdout, rows, n);
    else
        print_table(stdout, rows, n);
    kvs_sessions_free(rows, n);
    kvs_close(c);
    return rc == 0 ? 0 : 1;
}
