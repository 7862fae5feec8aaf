/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare stats: the daemon's pool, index and traffic counters, for a person
 * (a few aligned lines and a namespace table) or a script (--json).
 */
#include <stdio.h>
#include <string.h>

#include "cmd_common.h"

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static const char *backend_name(kvs_backend_t b)
{
    return b == KVS_BACKEND_CUDA ? "cuda" : b == KVS_BACKEND_HOST ? "host" : "?";
}

/* Every counter of KVS_COUNTERS, by its name, in list order. */
#define COUNTER_NAME(name, ...) #name,
static const char *const counter_names[] = {KVS_COUNTERS(COUNTER_NAME)};
#undef COUNTER_NAME

/* Several devices (--devices): one line per device, in rank order. A
 * daemon of one device prints none (its pool line says it all). */
static void print_devices(FILE *f, const kvs_stats_t *s)
{
    char a[32], b[32];
    if (s->n_devices < 2)
        return;
    fprintf(f, "\n%-6s %4s %10s %10s %6s %7s %8s %8s  %s\n", "DEVICE", "RANK", "POOL", "USED",
            "USED %", "WORKERS", "WRITTEN", "MISSING", "BACKEND");
    for (size_t i = 0; i < s->n_devices; i++) {
        const kvs_device_stats_t *d = &s->devices[i];
        fprintf(f, "%-6d %4u %10s %10s %5.1f%% %7u %8u %8u  %s\n", d->ordinal, d->rank,
                units_format_bytes(d->pool_bytes, 1, a, sizeof(a)),
                units_format_bytes(d->used_bytes, 1, b, sizeof(b)),
                pct(d->used_bytes, d->pool_bytes), d->workers, d->shards_written, d->shards_missing,
                d->detail);
    }
}

/* The cluster tier's nodes (kvshared cluster_seeds): nothing without one. */
static void print_cluster_nodes(FILE *f, const kvs_stats_t *s)
{
    if (s->n_cluster_nodes == 0)
        return;
    fprintf(f, "\n%-24s %-12s %6s %12s %10s %10s %10s\n", "CLUSTER NODE", "STATE", "SLOTS",
            "REQUESTS", "ERRORS", "MEAN ms", "MAX ms");
    for (size_t i = 0; i < s->n_cluster_nodes; i++) {
        const kvs_cluster_node_t *n = &s->cluster_nodes[i];
        double mean = n->replies ? (double)n->latency_us_sum / (double)n->replies / 1000.0 : 0.0;
        fprintf(f, "%-24s %-12s %6u %12llu %10llu %10.3f %10.3f\n", n->address, n->state, n->slots,
                (unsigned long long)n->requests, (unsigned long long)n->errors, mean,
                (double)n->latency_us_max / 1000.0);
    }
}

/* Every counter, two to a line. The name column is as wide as the longest
 * name and the value column as wide as the widest value, so the columns line
 * up whatever the names (new counters) and the values (a long uptime). */
static void print_counters(FILE *f, const kvs_stats_t *s)
{
    int name_w = 0, value_w = 1;
    for (size_t i = 0; i < KVS_N_COUNTERS; i++) {
        char v[24];
        int n = (int)strlen(counter_names[i]);
        int w = snprintf(v, sizeof(v), "%llu", (unsigned long long)s->counters[i]);
        name_w = n > name_w ? n : name_w;
        value_w = w > value_w ? w : value_w;
    }
    fprintf(f, "\ncounters since start\n");
    for (size_t i = 0; i < KVS_N_COUNTERS; i++)
        fprintf(f, "  %-*s %*llu%s", name_w, counter_names[i], value_w,
                (unsigned long long)s->counters[i],
                i % 2 == 1 || i + 1 == KVS_N_COUNTERS ? "\n" : "    ");
}

void cli_print_stats(FILE *f, const kvs_stats_t *s)
{
    char a[32], b[32], up[32];
    fprintf(f, "backend   %s, up %s\n", backend_name(s->backend),
            units_format_ms(s->uptime_ms, up, sizeof(up)));
    fprintf(f, "pool      %u blocks x %s = %s (%u tokens per block)\n", s->total_blocks,
            units_format_bytes(s->block_bytes, 1, a, sizeof(a)),
            units_format_bytes(s->pool_bytes, 1, b, sizeof(b)), s->block_tokens);
    fprintf(f, "blocks    free %u (%.1f%%)  writing %u  cached %u  pinned %u  used %.1f%%\n",
            s->free_blocks, pct(s->free_blocks, s->total_blocks), s->writing_blocks,
            s->cached_blocks, s->pinned_blocks,
            pct(s->total_blocks - s->free_blocks, s->total_blocks));
    if (s->tier2_total_blocks > 0)
        fprintf(f, "tier 2    %u blocks x %s in host memory: cached %u (%.1f%%)  copying %u\n",
                s->tier2_total_blocks, units_format_bytes(s->block_bytes, 1, a, sizeof(a)),
                s->tier2_cached_blocks, pct(s->tier2_cached_blocks, s->tier2_total_blocks),
                s->copying_blocks);
    if (s->tier3_total_blocks > 0)
        fprintf(f,
                "tier 3    %u blocks on disk (%s I/O): cached %u (%.1f%%)  read %llu  crc "
                "failures %llu\n",
                s->tier3_total_blocks, s->disk_io ? s->disk_io : "?", s->tier3_cached_blocks,
                pct(s->tier3_cached_blocks, s->tier3_total_blocks),
                (unsigned long long)s->disk_reads, (unsigned long long)s->disk_crc_failures);
    if (s->copy_path)
        fprintf(f, "copies    %s\n", s->copy_path);
    fprintf(f, "index     %s\n", units_format_bytes(s->index_bytes, 1, a, sizeof(a)));
    fprintf(f, "sessions  %u open\n", s->sessions);
    fprintf(f, "loop      longest work between polls %.1f ms\n", s->loop_busy_max_us / 1000.0);
    print_devices(f, s);
    print_counters(f, s);
    if (s->n_namespaces == 0) {
        fprintf(f, "\nno namespace yet (no lookup or commit so far)\n");
        return;
    }
    fprintf(f, "\n%-20s %10s %12s %12s %8s %8s %8s %8s\n", "NAMESPACE", "LOOKUPS", "TOKENS",
            "HIT TOKENS", "HIT %", "CACHED", "PINNED", "EVICTED");
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        fprintf(f, "%-20s %10llu %12llu %12llu %7.1f%% %8u %8u %8llu\n", n->name,
                (unsigned long long)n->lookups, (unsigned long long)n->lookup_tokens,
                (unsigned long long)n->hit_tokens, pct(n->hit_tokens, n->lookup_tokens),
                n->cached_blocks, n->pinned_blocks, (unsigned long long)n->evicted_blocks);
    }
    if (s->tier2_total_blocks > 0) {
        /* Hits by tier: tier-2 hits are part of HIT TOKENS above. */
        fprintf(f, "\n%-20s %12s %12s %8s %8s %8s\n", "NAMESPACE", "TIER-1 HITS", "TIER-2 HITS",
                "T2 HIT %", "TIER 1", "TIER 2");
        for (size_t i = 0; i < s->n_namespaces; i++) {
            const kvs_ns_stats_t *n = &s->namespaces[i];
            fprintf(f, "%-20s %12llu %12llu %7.1f%% %8u %8u\n", n->name,
                    (unsigned long long)(n->hit_tokens - n->tier2_hit_tokens),
                    (unsigned long long)n->tier2_hit_tokens,
                    pct(n->tier2_hit_tokens, n->lookup_tokens), n->cached_blocks, n->tier2_blocks);
        }
    }
    print_cluster_nodes(f, s);
    fprintf(f, "\n");
    cli_print_capacity(f, s, NULL);
}

static const char *const band_names[KVS_PRIORITY_BANDS] = {"0-24", "25-49", "50-74", "75-100"};

/* Each namespace's blocks by retention priority band: cached now, and
 * evicted since start (by band when dropped). Nothing from a library that
 * predates the bands. */
static void print_priority_bands(FILE *f, const kvs_stats_t *s, const char *ns)
{
    fprintf(f, "\n%-20s %-8s", "NAMESPACE", "PRIORITY");
    for (size_t b = 0; b < KVS_PRIORITY_BANDS; b++)
        fprintf(f, " %10s", band_names[b]);
    fprintf(f, "\n");
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        if ((ns && strcmp(ns, n->name) != 0) || !n->bands)
            continue;
        for (int evicted = 0; evicted < 2; evicted++) {
            fprintf(f, "%-20s %-8s", evicted ? "" : n->name, evicted ? "evicted" : "cached");
            for (size_t b = 0; b < KVS_PRIORITY_BANDS; b++)
                fprintf(f, " %10llu",
                        (unsigned long long)(evicted ? n->bands->evicted[b] : n->bands->cached[b]));
            fprintf(f, "\n");
        }
    }
}

void cli_print_capacity(FILE *f, const kvs_stats_t *s, const char *ns)
{
    fprintf(f, "%-20s %8s %8s %8s %10s %10s %10s %10s\n", "NAMESPACE", "HELD", "RESERVE", "QUOTA",
            "EVICTED", "FOR OWN", "FOR OTHERS", "AT QUOTA");
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        char quota[16] = "-";
        if (ns && strcmp(ns, n->name) != 0)
            continue;
        if (n->quota)
            snprintf(quota, sizeof(quota), "%u", n->quota);
        fprintf(f, "%-20s %8u %8u %8s %10llu %10llu %10llu %10llu\n", n->name, n->cached_blocks,
                n->reserve, quota, (unsigned long long)n->evicted_blocks,
                (unsigned long long)n->evicted_own, (unsigned long long)n->evicted_others,
                (unsigned long long)n->evicted_quota);
    }
    print_priority_bands(f, s, ns);
}

static void print_json(FILE *f, const kvs_stats_t *s, const kvs_restore_status_t *rs)
{
    fprintf(f,
            "{\"backend\":\"%s\",\"uptime_ms\":%llu,\"block_tokens\":%u,\"block_bytes\":%llu,"
            "\"pool_bytes\":%llu,\"blocks\":{\"total\":%u,\"free\":%u,\"writing\":%u,"
            "\"cached\":%u,\"pinned\":%u},\"index_bytes\":%llu,\"sessions\":%u",
            backend_name(s->backend), (unsigned long long)s->uptime_ms, s->block_tokens,
            (unsigned long long)s->block_bytes, (unsigned long long)s->pool_bytes, s->total_blocks,
            s->free_blocks, s->writing_blocks, s->cached_blocks, s->pinned_blocks,
            (unsigned long long)s->index_bytes, s->sessions);
    fprintf(f, ",\"tier2\":{\"total\":%u,\"cached\":%u,\"copying\":%u}", s->tier2_total_blocks,
            s->tier2_cached_blocks, s->copying_blocks);
    fprintf(f, ",\"tier3\":{\"total\":%u,\"cached\":%u,\"io\":\"%s\"", s->tier3_total_blocks,
            s->tier3_cached_blocks, s->disk_io ? s->disk_io : "");
    if (rs->phase[0])
        fprintf(f,
                ",\"restore\":{\"phase\":\"%s\",\"slots\":%llu,\"scanned\":%llu,\"records\":%llu,"
                "\"restored\":%llu,\"dropped\":%llu,\"elapsed_ms\":%llu}",
                rs->phase, (unsigned long long)rs->slots, (unsigned long long)rs->scanned,
                (unsigned long long)rs->records, (unsigned long long)rs->restored,
                (unsigned long long)rs->dropped, (unsigned long long)rs->elapsed_ms);
    fputc('}', f);
    fprintf(f, ",\"loop_busy_max_us\":%u", s->loop_busy_max_us);
    if (s->copy_path) {
        /* Plain text: no quotes or backslashes in it, but say so safely. */
        fputs(",\"copy_path\":\"", f);
        for (const char *p = s->copy_path; *p; p++)
            if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
                fputc(*p, f);
        fputc('"', f);
    }
    fprintf(f, ",\"devices\":[");
    for (size_t i = 0; i < s->n_devices; i++) {
        const kvs_device_stats_t *d = &s->devices[i];
        fprintf(f, "%s{\"rank\":%u,\"ordinal\":%d,\"detail\":", i ? "," : "", d->rank, d->ordinal);
        cli_json_string(f, d->detail);
        fprintf(f,
                ",\"pool_bytes\":%llu,\"used_bytes\":%llu,\"workers\":%u,"
                "\"shards_written\":%u,\"shards_missing\":%u}",
                (unsigned long long)d->pool_bytes, (unsigned long long)d->used_bytes, d->workers,
                d->shards_written, d->shards_missing);
    }
    fprintf(f, "]");
    for (size_t i = 0; i < KVS_N_COUNTERS; i++)
        fprintf(f, ",\"%s\":%llu", counter_names[i], (unsigned long long)s->counters[i]);
    fprintf(f, ",\"namespaces\":[");
    for (size_t i = 0; i < s->n_namespaces; i++) {
        const kvs_ns_stats_t *n = &s->namespaces[i];
        fprintf(f, "%s{\"name\":", i ? "," : "");
        cli_json_string(f, n->name);
        fprintf(f,
                ",\"lookups\":%llu,\"lookup_tokens\":%llu,\"hit_tokens\":%llu,"
                "\"hit_rate\":%.4f,\"inserted_blocks\":%llu,\"duplicate_blocks\":%llu,"
                "\"evicted_blocks\":%llu,\"evicted_own\":%llu,\"evicted_others\":%llu,"
                "\"evicted_quota\":%llu,\"cached_blocks\":%u,\"pinned_blocks\":%u,"
                "\"quota\":%u,\"reserve\":%u,\"tier2_blocks\":%u,\"tier2_hit_tokens\":%llu",
                (unsigned long long)n->lookups, (unsigned long long)n->lookup_tokens,
                (unsigned long long)n->hit_tokens, pct(n->hit_tokens, n->lookup_tokens) / 100.0,
                (unsigned long long)n->inserted_blocks, (unsigned long long)n->duplicate_blocks,
                (unsigned long long)n->evicted_blocks, (unsigned long long)n->evicted_own,
                (unsigned long long)n->evicted_others, (unsigned long long)n->evicted_quota,
                n->cached_blocks, n->pinned_blocks, n->quota, n->reserve, n->tier2_blocks,
                (unsigned long long)n->tier2_hit_tokens);
        for (int evicted = 0; n->bands && evicted < 2; evicted++) {
            fprintf(f, ",\"%s_by_priority\":{", evicted ? "evicted" : "cached");
            for (size_t b = 0; b < KVS_PRIORITY_BANDS; b++)
                fprintf(f, "%s\"%s\":%llu", b ? "," : "", band_names[b],
                        (unsigned long long)(evicted ? n->bands->evicted[b] : n->bands->cached[b]));
            fprintf(f, "}");
        }
        fprintf(f, "}");
    }
    fprintf(f, "]");
    if (s->n_cluster_nodes > 0) {
        fprintf(f, ",\"cluster_nodes\":[");
        for (size_t i = 0; i < s->n_cluster_nodes; i++) {
            const kvs_cluster_node_t *n = &s->cluster_nodes[i];
            fprintf(f, "%s{\"address\":", i ? "," : "");
            cli_json_string(f, n->address);
            fprintf(f, ",\"state\":");
            cli_json_string(f, n->state);
            fprintf(f,
                    ",\"slots\":%u,\"requests\":%llu,\"errors\":%llu,\"replies\":%llu,"
                    "\"latency_us_sum\":%llu,\"latency_us_max\":%llu}",
                    n->slots, (unsigned long long)n->requests, (unsigned long long)n->errors,
                    (unsigned long long)n->replies, (unsigned long long)n->latency_us_sum,
                    (unsigned long long)n->latency_us_max);
        }
        fprintf(f, "]");
    }
    fprintf(f, "}\n");
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare stats [--json] [--socket PATH] [--timeout MS]\n"
               "\n"
               "Pool usage, blocks free/writing/cached/pinned, evictions, sessions, and per\n"
               "namespace lookups, hit rate in tokens, blocks held against the reservation\n"
               "and evictions by cause (the namespace's own need, other namespaces' need,\n"
               "its quota), and blocks cached and evicted by retention priority band.\n"
               "With a tier 2 (kvshared --host-tier): its usage, and hits and blocks by\n"
               "tier per namespace. With a cluster tier (kvshared --cluster-seeds): each\n"
               "cluster node's state, slots, requests, errors and reply latency.\n");
}

int kvshare_cmd_stats(int argc, char **argv)
{
    cli_conn_t conn = {0};
    int json = 0;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "stats");
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
            fprintf(stderr, "kvshare stats: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    kvs_client_t *c = cli_connect(&conn, "stats");
    if (!c)
        return 1;
    kvs_stats_t s;
    int rc = kvs_stats(c, &s);
    if (rc != 0) {
        fprintf(stderr, "kvshare stats: %s\n", kvs_last_error(c));
        kvs_close(c);
        return 1;
    }
    kvs_restore_status_t rs = {0};
    if (s.tier3_total_blocks > 0)
        (void)kvs_restore_status(c, &rs);
    if (json) {
        print_json(stdout, &s, &rs);
    } else {
        cli_print_stats(stdout, &s);
        if (rs.phase[0])
            printf("restore   %s: %llu of %llu slots read, %llu records found, %llu restored, "
                   "%llu dropped, %.1f s\n",
                   rs.phase, (unsigned long long)rs.scanned, (unsigned long long)rs.slots,
                   (unsigned long long)rs.records, (unsigned long long)rs.restored,
                   (unsigned long long)rs.dropped, (double)rs.elapsed_ms / 1000.0);
    }
    kvs_stats_free(&s);
    kvs_close(c);
    return 0;
}
