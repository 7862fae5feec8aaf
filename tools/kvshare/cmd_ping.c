/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare ping: round trips to the daemon (a Ping RPC carrying --size
 * bytes each way), one line each, then min / avg / max like ping(8).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_common.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare ping [--count N] [--size BYTES] [--interval SECONDS] "
               "[--socket PATH] [--timeout MS]\n"
               "\n"
               "Round-trip time to kvshared (default 5 pings of 64 bytes, 0.2 s apart).\n");
}

int kvshare_cmd_ping(int argc, char **argv)
{
    cli_conn_t conn = {0};
    long count = 5, size = 64;
    double interval = 0.2;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "ping");
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) {
            count = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            size = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
            uint64_t ms;
            if (units_parse_ms(argv[++i], 1000, &ms) != 0) {
                fprintf(stderr,
                        "kvshare ping: --interval takes a duration (0.5, 200ms), not '%s'\n",
                        argv[i]);
                return 2;
            }
            interval = (double)ms / 1000.0;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kvshare ping: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (count <= 0 || size < 0 || size > (8 << 20) || interval < 0 || interval > 60) {
        fprintf(stderr, "kvshare ping: --count > 0, --size 0 to 8388608, --interval 0 to 60\n");
        return 2;
    }
    kvs_client_t *c = cli_connect(&conn, "ping");
    if (!c)
        return 1;
    double min = 0, max = 0, sum = 0;
    long ok = 0;
    for (long i = 0; i < count; i++) {
        double rtt = 0;
        int rc = kvs_ping(c, (size_t)size, &rtt);
        if (rc != 0) {
            printf("ping %ld: %s\n", i + 1, kvs_last_error(c));
        } else {
            printf("ping %ld: %ld bytes, %.1f us\n", i + 1, size, rtt);
            if (ok == 0 || rtt < min)
                min = rtt;
            if (rtt > max)
                max = rtt;
            sum += rtt;
            ok++;
        }
        fflush(stdout);
        if (i + 1 < count && interval > 0) {
            struct timespec sl = {(time_t)interval,
                                  (long)((interval - (double)(time_t)interval) * 1e9)};
            nanosleep(&sl, NULL);
        }
    }
    printf("%ld sent, %ld answered", count, ok);
    if (ok)
        printf(", rtt min/avg/max %.1f/%.1f/%.1f us", min, sum / (double)ok, max);
    printf("\n");
    kvs_close(c);
    return ok == count ? 0 : 1;
}
