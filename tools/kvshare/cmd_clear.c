/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare clear NAMESPACE: drops the namespace's cached blocks that no
 * worker pins (a Clear RPC); pinned blocks, their prefixes and blocks being
 * written stay. Says how many went and how many stayed.
 */
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare clear NAMESPACE [--socket PATH] [--timeout MS]\n"
               "\n"
               "Drops NAMESPACE's cached blocks that no worker pins (pinned blocks, their\n"
               "prefixes and blocks being written stay); other namespaces are untouched.\n");
}

int kvshare_cmd_clear(int argc, char **argv)
{
    cli_conn_t conn = {0};
    const char *ns = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "clear");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || ns) {
            fprintf(stderr, "kvshare clear: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        ns = argv[i];
    }
    if (!ns) {
        fprintf(stderr, "kvshare clear: name the namespace to clear (`kvshare stats` lists "
                        "them)\n");
        usage(stderr);
        return 2;
    }
    kvs_client_t *c = cli_connect(&conn, "clear");
    if (!c)
        return 1;
    size_t cleared = 0, kept = 0;
    int rc = kvs_clear(c, ns, &cleared, &kept);
    if (rc != 0)
        fprintf(stderr, "kvshare clear: %s\n", kvs_last_error(c));
    else
        printf("namespace '%s': %zu blocks dropped, %zu kept (pinned, or a pinned block's "
               "prefix)\n",
               ns, cleared, kept);
    kvs_close(c);
    return rc == 0 ? 0 : 1;
}
