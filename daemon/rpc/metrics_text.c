/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The Prometheus text exposition (format 0.0.4) of the daemon's metrics.
 * Names follow vLLM's where the meaning is the same (prefix-cache queries and
 * hits counted in tokens, kv_cache_usage_perc as a 0..1 ratio), with a
 * kvshare_ prefix. Every figure comes from the same places the Stats RPC
 * reads, so `kvshare stats` and /metrics agree.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_store.h"
#include "dispatch.h"
#include "kvshare_status.h"
#include "kvshare_version.h"
#include "metrics_text.h"
#include "now.h"
#include "proc_self.h"
#include "server.h"
#include "store.h"
#include "store_restore.h"
#include "disk.h"

typedef struct text {
    char *buf;
    size_t len, cap;
    int failed;
} text_t;

static void put(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(text_t *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        if (t->failed)
            return;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (!b) {
            t->failed = 1;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

static void head(text_t *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Namespace names are [^"\\\n] in practice, but a label value must escape
 * them anyway. */
static void label_value(text_t *t, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"')
            put(t, "\\%c", *p);
        else if (*p == '\n')
            put(t, "\\n");
        else
            put(t, "%c", *p);
    }
}

static void ns_series(text_t *t, const char *name, const char *ns, const char *cause,
                      unsigned long long v)
{
    put(t, "%s{namespace=\"", name);
    label_value(t, ns);
    if (cause)
        put(t, "\",cause=\"%s", cause);
    put(t, "\"} %llu\n", v);
}

/* One histogram; `scale` converts its unit to seconds (1e-9 for ns). */
static void hist(text_t *t, const char *name, const char *labels, const metrics_hist_t *h,
                 const uint64_t *bounds, size_t n_bounds, double scale)
{
    uint64_t cum = 0;
    const char *sep = labels[0] ? "," : "";
    for (size_t i = 0; i < n_bounds; i++) {
        cum += h->buckets[i];
        put(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, (double)bounds[i] * scale,
            (unsigned long long)cum);
    }
    cum += h->buckets[n_bounds];
    put(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    if (labels[0]) {
        put(t, "%s_sum{%s} %.9g\n", name, labels, (double)h->sum * scale);
        put(t, "%s_count{%s} %llu\n", name, labels, (unsigned long long)h->count);
    } else {
        put(t, "%s_sum %.9g\n", name, (double)h->sum * scale);
        put(t, "%s_count %llu\n", name, (unsigned long long)h->count);
    }
}

enum ns_field {
    NS_QUERIES,
    NS_HITS,
    NS_LOOKUPS,
    NS_CACHED,
    NS_PINNED,
    NS_EVICTED,
    NS_EVICTED_OWN,
    NS_EVICTED_OTHERS,
    NS_EVICTED_QUOTA,
    NS_INSERTED,
    NS_QUOTA,
    NS_RESERVE,
    NS_TIER2_HITS,
    NS_TIER2_CACHED,
};

/* Rows of one family are adjacent; a row with a cause adds that label. */
static const struct {
    const char *name, *type, *help;
    enum ns_field field;
    const char *cause;
} ns_families[] = {
    {"kvshare_prefix_cache_queries_total", "counter",
     "Prompt tokens looked up in the prefix cache, per namespace", NS_QUERIES, NULL},
    {"kvshare_prefix_cache_hits_total", "counter",
     "Prompt tokens found in the prefix cache, per namespace", NS_HITS, NULL},
    {"kvshare_prefix_cache_lookups_total", "counter", "Lookup requests, per namespace", NS_LOOKUPS,
     NULL},
    {"kvshare_namespace_cached_blocks", "gauge", "Blocks cached, per namespace", NS_CACHED, NULL},
    {"kvshare_namespace_pinned_blocks", "gauge", "Cached blocks pinned, per namespace", NS_PINNED,
     NULL},
    {"kvshare_namespace_evicted_blocks_total", "counter",
     "Blocks dropped by eviction or quota, per namespace", NS_EVICTED, NULL},
    {"kvshare_namespace_evictions_total", "counter",
     "Blocks dropped, per namespace and cause: own (its own need), others (another "
     "namespace's need, or an Alloc naming none), quota",
     NS_EVICTED_OWN, "own"},
    {"kvshare_namespace_evictions_total", "counter", NULL, NS_EVICTED_OTHERS, "others"},
    {"kvshare_namespace_evictions_total", "counter", NULL, NS_EVICTED_QUOTA, "quota"},
    {"kvshare_namespace_inserted_blocks_total", "counter",
     "Blocks that became cached, per namespace", NS_INSERTED, NULL},
    {"kvshare_namespace_quota_blocks", "gauge", "Quota in blocks (0: none), per namespace",
     NS_QUOTA, NULL},
    {"kvshare_namespace_reserved_blocks", "gauge",
     "Blocks guaranteed to the namespace: others' need never evicts it below them, and below "
     "them its need takes blocks back from namespaces above their reservations",
     NS_RESERVE, NULL},
    {"kvshare_prefix_cache_tier2_hits_total", "counter",
     "Prompt tokens found in tier 2 (host memory), per namespace: part of "
     "kvshare_prefix_cache_hits_total",
     NS_TIER2_HITS, NULL},
    {"kvshare_namespace_tier2_blocks", "gauge",
     "Blocks in tier 2 (host memory), per namespace (kvshare_namespace_cached_blocks counts "
     "the pool)",
     NS_TIER2_CACHED, NULL},
};

static unsigned long long ns_field(const radix_ns_stats_t *st, enum ns_field f)
{
    switch (f) {
    case NS_QUERIES:
        return st->lookup_tokens;
    case NS_HITS:
        return st->hit_tokens;
    case NS_LOOKUPS:
        return st->lookups;
    case NS_CACHED:
        return st->cached_blocks;
    case NS_PINNED:
        return st->pinned_blocks;
    case NS_EVICTED:
        return st->evicted_blocks;
    case NS_EVICTED_OWN:
        return st->evicted_own;
    case NS_EVICTED_OTHERS:
        return st->evicted_others;
    case NS_EVICTED_QUOTA:
        return st->evicted_quota;
    case NS_INSERTED:
        return st->inserted_blocks;
    case NS_QUOTA:
        return st->quota;
    case NS_RESERVE:
        return st->reserve;
    case NS_TIER2_HITS:
        return st->t2_hit_tokens;
    case NS_TIER2_CACHED:
        return st->tier2_blocks;
    }
    return 0;
}

/* The Prometheus family, labels and help of each counter of KVS_COUNTERS. */
#define COUNTER_ROW(name, named, family, labels, help) {#name, family, labels, help},
static const struct {
    const char *name, *family, *labels, *help;
} counter_rows[] = {KVS_COUNTERS(COUNTER_ROW) KVS_COUNTERS_NEXT(COUNTER_ROW)};
#undef COUNTER_ROW

/* Decimal places of a counter kept in milliseconds, microseconds or
 * nanoseconds (its C name ends in _ms, _us or _ns; its family is in
 * seconds), 0 for any other. */
static int counter_decimals(const char *name)
{
    static const struct {
        const char *suffix;
        int decimals;
    } units[] = {{"_ms", 3}, {"_us", 6}, {"_ns", 9}};
    size_t len = strlen(name);
    for (size_t u = 0; u < sizeof(units) / sizeof(units[0]); u++)
        if (len > 3 && strcmp(name + len - 3, units[u].suffix) == 0)
            return units[u].decimals;
    return 0;
}

/* A counter's value in its family's unit: exact, as the integer it is or as
 * seconds with the decimals its unit has (1234567 us is 1.234567). */
static void counter_value(text_t *t, const char *name, unsigned long long v)
{
    int decimals = counter_decimals(name);
    unsigned long long div = 1;
    for (int i = 0; i < decimals; i++)
        div *= 10;
    if (decimals)
        put(t, "%llu.%0*llu\n", v / div, decimals, v % div);
    else
        put(t, "%llu\n", v);
}

/* Every counter, one family at a time: the format wants a family's samples
 * together, and a label added to a family later is appended to the list. */
static void counters(text_t *t, const metrics_t *m)
{
    for (size_t i = 0; i < KVS_N_COUNTERS_ALL; i++) {
        size_t first = 0;
        while (strcmp(counter_rows[first].family, counter_rows[i].family) != 0)
            first++;
        if (first < i)
            continue; /* printed with the family's first counter */
        head(t, counter_rows[i].family, "counter", counter_rows[i].help);
        for (size_t j = i; j < KVS_N_COUNTERS_ALL; j++) {
            if (strcmp(counter_rows[j].family, counter_rows[i].family) != 0)
                continue;
            if (counter_rows[j].labels[0])
                put(t, "%s{%s} ", counter_rows[j].family, counter_rows[j].labels);
            else
                put(t, "%s ", counter_rows[j].family);
            counter_value(t, counter_rows[j].name, (unsigned long long)m->counters[j]);
        }
    }
}

/* What the config file says each namespace is for: the hit rate it is designed
 * for (the alert rules compare the measured rate with it) and its tier (for
 * hit rates by tier). Only namespaces whose section sets the key appear. */
static void ns_design(text_t *t, const server_t *srv)
{
    const config_t *conf = srv->ns.conf;
    head(t, "kvshare_namespace_hit_rate_target", "gauge",
         "Prefix-cache hit rate a namespace is designed for (config hit_rate_target)");
    for (uint32_t i = 0; conf && i < conf->n_ns; i++) {
        if (conf->ns[i].hit_rate_target <= 0)
            continue;
        put(t, "kvshare_namespace_hit_rate_target{namespace=\"");
        label_value(t, conf->ns[i].name);
        put(t, "\"} %g\n", conf->ns[i].hit_rate_target);
    }
    head(t, "kvshare_namespace_tier", "gauge",
         "Service tier of a namespace (config tier), value 1");
    for (uint32_t i = 0; conf && i < conf->n_ns; i++) {
        if (!conf->ns[i].tier[0])
            continue;
        put(t, "kvshare_namespace_tier{namespace=\"");
        label_value(t, conf->ns[i].name);
        put(t, "\",tier=\"");
        label_value(t, conf->ns[i].tier);
        put(t, "\"} 1\n");
    }
}

/* Tier 3 (disk_tier_path), only when one is open: its file, I/O engine and
 * what its start-up scan found. */
/* The warm restart in the background (store_restore.h). */
static void disk_restore(text_t *t, const server_t *srv)
{
    store_restore_progress_t rp;
    store_restore_progress(srv, &rp);
    if (!rp.phase)
        return; /* a new file: nothing to restore */
    static const char *const phases[] = {"scanning", "restoring", "done", "failed"};
    head(t, "kvshare_tier3_restore_phase", "gauge",
         "The tier 3 warm restart: 1 for the phase it is in");
    for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++)
        put(t, "kvshare_tier3_restore_phase{phase=\"%s\"} %d\n", phases[i],
            strcmp(rp.phase, phases[i]) == 0);
    head(t, "kvshare_tier3_restore_slots", "gauge",
         "Tier 3 warm restart: the file's slots, and those read so far");
    put(t, "kvshare_tier3_restore_slots{state=\"total\"} %llu\n", (unsigned long long)rp.slots);
    put(t, "kvshare_tier3_restore_slots{state=\"scanned\"} %llu\n", (unsigned long long)rp.scanned);
    head(t, "kvshare_tier3_restore_records", "gauge",
         "Tier 3 warm restart: valid records found, restored into the index, dropped");
    put(t, "kvshare_tier3_restore_records{state=\"found\"} %llu\n", (unsigned long long)rp.records);
    put(t, "kvshare_tier3_restore_records{state=\"restored\"} %llu\n",
        (unsigned long long)rp.restored);
    put(t, "kvshare_tier3_restore_records{state=\"dropped\"} %llu\n",
        (unsigned long long)rp.dropped);
    head(t, "kvshare_tier3_restore_seconds", "gauge",
         "Tier 3 warm restart: seconds since it began, to its end once ended");
    put(t, "kvshare_tier3_restore_seconds %.3f\n", (double)rp.elapsed_ms / 1000.0);
}

static void disk_tier(text_t *t, const disk_t *td, uint64_t restored)
{
    disk_stats_t st;
    disk_stats(td, &st);
    head(t, "kvshare_tier3_restored_blocks", "gauge",
         "Blocks the tier 3 file gave back to the index at start (warm restart)");
    put(t, "kvshare_tier3_restored_blocks %llu\n", (unsigned long long)restored);
    head(t, "kvshare_tier3_info", "gauge", "Tier 3 (a local disk file): its I/O engine");
    put(t, "kvshare_tier3_info{io=\"%s\"} 1\n", st.io);
    head(t, "kvshare_tier3_slots", "gauge", "Tier 3 slots: total, used");
    put(t, "kvshare_tier3_slots{state=\"total\"} %u\n", st.slots);
    put(t, "kvshare_tier3_slots{state=\"used\"} %u\n", st.used);
    head(t, "kvshare_tier3_recovered_blocks", "gauge",
         "Tier 3 records that verified at start (the last restart kept them)");
    put(t, "kvshare_tier3_recovered_blocks %llu\n", (unsigned long long)st.recovered);
    head(t, "kvshare_tier3_torn_slots", "gauge",
         "Tier 3 slots whose record failed its CRC at start: skipped, never served");
    put(t, "kvshare_tier3_torn_slots %llu\n", (unsigned long long)st.torn);
    head(t, "kvshare_tier3_crc_failures_total", "counter",
         "Tier 3 reads whose slot failed its CRC (a miss, never wrong bytes)");
    put(t, "kvshare_tier3_crc_failures_total %llu\n", (unsigned long long)st.crc_failures);
    head(t, "kvshare_tier3_io_errors_total", "counter", "Tier 3 reads and writes the disk failed");
    put(t, "kvshare_tier3_io_errors_total %llu\n", (unsigned long long)st.io_errors);
    head(t, "kvshare_tier3_io_total", "counter", "Tier 3 slot reads and writes that succeeded");
    put(t, "kvshare_tier3_io_total{op=\"read\"} %llu\n", (unsigned long long)st.reads);
    put(t, "kvshare_tier3_io_total{op=\"write\"} %llu\n", (unsigned long long)st.writes);
    head(t, "kvshare_tier3_io_bytes_total", "counter",
         "Block bytes read from and written to tier 3");
    put(t, "kvshare_tier3_io_bytes_total{op=\"read\"} %llu\n", (unsigned long long)st.read_bytes);
    put(t, "kvshare_tier3_io_bytes_total{op=\"write\"} %llu\n", (unsigned long long)st.write_bytes);
}

/* Per device of the group (--devices; one for a daemon of one device),
 * labelled device="ordinal" and rank="r": its pool, the bytes in use (the
 * same blocks on every device), its rank's workers and the shards of
 * blocks still being written. */
static void devices(text_t *t, const server_t *srv, uint32_t used_blocks)
{
    uint32_t n = srv->n_devices, written[SERVER_MAX_DEVICES], missing[SERVER_MAX_DEVICES];
    uint32_t workers[SERVER_MAX_DEVICES];
    store_device_counts(srv->store, written, missing, workers);
    static const char *const names[] = {"kvshare_device_pool_bytes", "kvshare_device_used_bytes",
                                        "kvshare_device_workers", "kvshare_device_shards",
                                        "kvshare_device_shards"};
    head(t, names[0], "gauge", "Bytes of the pool on each device");
    for (uint32_t d = 0; d < n; d++)
        put(t, "%s{device=\"%d\",rank=\"%u\"} %llu\n", names[0], srv->device_ordinals[d], d,
            (unsigned long long)backend_size(srv->backends[d]));
    head(t, names[1], "gauge",
         "Bytes of each device's pool in use (blocks writing or cached; block ids name the same "
         "slot on every device)");
    for (uint32_t d = 0; d < n; d++)
        put(t, "%s{device=\"%d\",rank=\"%u\"} %llu\n", names[1], srv->device_ordinals[d], d,
            (unsigned long long)used_blocks * srv->block_bytes);
    head(t, names[2], "gauge", "Sessions connected as each device's rank");
    for (uint32_t d = 0; d < n; d++)
        put(t, "%s{device=\"%d\",rank=\"%u\"} %u\n", names[2], srv->device_ordinals[d], d,
            workers[d]);
    head(t, names[3], "gauge",
         "Blocks being written by the group, per device: state written (this rank's shard is "
         "in, another rank's is not) or missing (another rank's is in, this rank's is not)");
    for (uint32_t d = 0; d < n; d++) {
        put(t, "%s{device=\"%d\",rank=\"%u\",state=\"written\"} %u\n", names[3],
            srv->device_ordinals[d], d, written[d]);
        put(t, "%s{device=\"%d\",rank=\"%u\",state=\"missing\"} %u\n", names[3],
            srv->device_ordinals[d], d, missing[d]);
    }
}

/* The cluster tier's nodes (cluster_seeds), one series per node and figure. */
static void cluster_nodes(text_t *t, server_t *srv)
{
    cluster_node_stats_t nodes[CLUSTER_MAX_NODES];
    size_t n = cluster_store_nodes(srv, nodes, CLUSTER_MAX_NODES);
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"kvshare_cluster_node_slots", "gauge",
         "Slots the cluster tier's map gives each node (0: not a master)"},
        {"kvshare_cluster_node_up", "gauge",
         "1 unless the node is counted down after a fault or refused AUTH"},
        {"kvshare_cluster_node_requests_total", "counter",
         "Commands sent to each cluster node, redirected ones included"},
        {"kvshare_cluster_node_command_errors_total", "counter",
         "Commands that ended badly on each cluster node (timeouts, lost, error replies)"},
        {"kvshare_cluster_node_latency_seconds_total", "counter",
         "Seconds from send to reply, summed over each cluster node's replies"},
        {"kvshare_cluster_node_replies_total", "counter", "Replies each cluster node gave"},
    };
    for (size_t f = 0; f < sizeof(fam) / sizeof(fam[0]); f++) {
        head(t, fam[f].name, fam[f].type, fam[f].help);
        for (size_t i = 0; i < n; i++) {
            const cluster_node_stats_t *nd = &nodes[i];
            put(t, "%s{node=\"", fam[f].name);
            label_value(t, nd->addr);
            put(t, "\"} ");
            switch (f) {
            case 0:
                put(t, "%u\n", nd->slots);
                break;
            case 1:
                put(t, "%d\n",
                    nd->state == CLUSTER_NODE_IDLE || nd->state == CLUSTER_NODE_CONNECTED);
                break;
            case 2:
                put(t, "%llu\n", (unsigned long long)nd->requests);
                break;
            case 3:
                put(t, "%llu\n", (unsigned long long)nd->errors);
                break;
            case 4:
                put(t, "%.6f\n", (double)nd->latency_us_sum / 1e6);
                break;
            default:
                put(t, "%llu\n", (unsigned long long)nd->replies);
                break;
            }
        }
    }
    head(t, "kvshare_cluster_settings_warnings", "gauge",
         "Problems the check of the cluster masters' eviction settings found at start (each "
         "logged at WARN; docs/CLUSTER.md, Sizing Redis)");
    put(t, "kvshare_cluster_settings_warnings %llu\n",
        (unsigned long long)srv->metrics.cluster_settings_warnings);
    head(t, "kvshare_cluster_fetch_seconds", "histogram",
         "Time from a Lookup's fetch from the cluster tier to its blocks placed in the pool");
    hist(t, "kvshare_cluster_fetch_seconds", "", &srv->metrics.cluster_fetch_time,
         metrics_latency_bounds_ns, metrics_latency_n_bounds, 1e-9);
}

/* The process_* families of the Prometheus client libraries, under their
 * names (no kvshare_ prefix), so that dashboards and alerts written for any
 * process work here; read now (proc_self.c). */
static void process(text_t *t)
{
    proc_self_t p;
    if (proc_self_read(&p) != 0)
        return;
    if (p.has_start_time) {
        head(t, "process_start_time_seconds", "gauge",
             "Start time of the process since unix epoch in seconds");
        put(t, "process_start_time_seconds %.2f\n", p.start_time_seconds);
    }
    if (p.has_cpu) {
        head(t, "process_cpu_seconds_total", "counter",
             "Total user and system CPU time spent in seconds");
        put(t, "process_cpu_seconds_total %.6f\n", p.cpu_seconds);
    }
    if (p.has_memory) {
        head(t, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes");
        put(t, "process_resident_memory_bytes %llu\n", (unsigned long long)p.resident_bytes);
        head(t, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes");
        put(t, "process_virtual_memory_bytes %llu\n", (unsigned long long)p.virtual_bytes);
    }
    if (p.has_open_fds) {
        head(t, "process_open_fds", "gauge", "Number of open file descriptors");
        put(t, "process_open_fds %llu\n", (unsigned long long)p.open_fds);
    }
    if (p.has_max_fds) {
        head(t, "process_max_fds", "gauge", "Maximum number of open file descriptors");
        put(t, "process_max_fds %.17g\n", (double)p.max_fds);
    }
}

int metrics_render(server_t *srv, char **out, size_t *len)
{
    text_t t = {0};
    const metrics_t *m = &srv->metrics;
    pool_counts_t c;
    uint32_t n_ns = radix_ns_id_end(srv->index); /* ids; reclaimed ones are skipped */

    store_sync_counters(srv->store);
    t.cap = 16384;
    t.buf = malloc(t.cap);
    if (!t.buf)
        return KVS_ENOMEM;
    t.buf[0] = '\0';
    pool_counts(srv->pool, &c);

    head(&t, "kvshare_info", "gauge", "kvshared version and backend (value 1)");
    put(&t, "kvshare_info{version=\"%d.%d.%d\",backend=\"%s\"} 1\n", KVS_VERSION_MAJOR,
        KVS_VERSION_MINOR, KVS_VERSION_PATCH,
        backend_kind(srv->backend) == BACKEND_CUDA ? "cuda" : "host");
    head(&t, "kvshare_uptime_seconds", "gauge", "Seconds since kvshared started");
    put(&t, "kvshare_uptime_seconds %.3f\n", (double)((uint64_t)now_ms() - srv->start_ms) / 1000.0);
    process(&t);

    /* One family at a time: the format wants each family's samples together. */
    for (size_t f = 0; f < sizeof(ns_families) / sizeof(ns_families[0]); f++) {
        if (ns_families[f].help)
            head(&t, ns_families[f].name, ns_families[f].type, ns_families[f].help);
        for (uint32_t i = 0; i < n_ns; i++) {
            radix_ns_stats_t st;
            if (radix_ns_stats(srv->index, i, &st) != 0)
                continue;
            ns_series(&t, ns_families[f].name, radix_ns_name(srv->index, i), ns_families[f].cause,
                      ns_field(&st, ns_families[f].field));
        }
    }

    ns_design(&t, srv);

    /* Retention priority bands (radix_hint): blocks cached and evicted. */
    static const char *const bands[RADIX_PRIO_BANDS] = {"0-24", "25-49", "50-74", "75-100"};
    for (int evicted = 0; evicted < 2; evicted++) {
        const char *name = evicted ? "kvshare_namespace_evicted_blocks_by_priority_total"
                                   : "kvshare_namespace_cached_blocks_by_priority";
        head(&t, name, evicted ? "counter" : "gauge",
             evicted ? "Blocks dropped, per namespace and retention priority band when dropped"
                     : "Blocks cached, per namespace and retention priority band");
        for (uint32_t i = 0; i < n_ns; i++) {
            radix_ns_stats_t st;
            if (radix_ns_stats(srv->index, i, &st) != 0)
                continue;
            for (int b = 0; b < RADIX_PRIO_BANDS; b++) {
                put(&t, "%s{namespace=\"", name);
                label_value(&t, radix_ns_name(srv->index, i));
                put(&t, "\",band=\"%s\"} %llu\n", bands[b],
                    evicted ? (unsigned long long)st.evicted_by_band[b]
                            : (unsigned long long)st.cached_by_band[b]);
            }
        }
    }

    head(&t, "kvshare_kv_cache_usage_perc", "gauge",
         "Fraction of pool blocks in use (writing or cached), 0 to 1");
    put(&t, "kvshare_kv_cache_usage_perc %.6f\n",
        c.total ? (double)(c.total - c.free) / (double)c.total : 0.0);
    head(&t, "kvshare_pool_blocks", "gauge", "Blocks in the pool");
    put(&t, "kvshare_pool_blocks %u\n", c.total);
    head(&t, "kvshare_pool_bytes", "gauge", "Bytes of the pool");
    put(&t, "kvshare_pool_bytes %llu\n",
        (unsigned long long)((uint64_t)srv->num_blocks * srv->block_bytes));
    head(&t, "kvshare_blocks", "gauge",
         "Blocks by state: free + writing + cached = pool; pinned is a part of cached");
    put(&t, "kvshare_blocks{state=\"free\"} %u\n", c.free);
    put(&t, "kvshare_blocks{state=\"writing\"} %u\n", c.writing);
    put(&t, "kvshare_blocks{state=\"cached\"} %u\n", c.cached);
    put(&t, "kvshare_blocks{state=\"pinned\"} %u\n", radix_pinned_blocks(srv->index));
    head(&t, "kvshare_tier2_blocks", "gauge",
         "Tier 2 (host memory, --host-tier) by state: total, cached, free; copying counts "
         "blocks moving between the tiers");
    put(&t, "kvshare_tier2_blocks{state=\"total\"} %u\n", srv->tier2_blocks);
    put(&t, "kvshare_tier2_blocks{state=\"cached\"} %u\n", radix_tier2_blocks(srv->index));
    put(&t, "kvshare_tier2_blocks{state=\"free\"} %u\n", radix_tier2_free(srv->index));
    put(&t, "kvshare_tier2_blocks{state=\"copying\"} %u\n", radix_busy_blocks(srv->index));
    if (srv->disk_tier) {
        disk_tier(&t, srv->disk_tier, m->disk_restored);
        disk_restore(&t, srv);
    }
    if (srv->cluster)
        cluster_nodes(&t, srv);
    head(&t, "kvshare_index_bytes", "gauge", "Memory of the prefix index");
    put(&t, "kvshare_index_bytes %llu\n", (unsigned long long)radix_memory_bytes(srv->index));
    devices(&t, srv, c.writing + c.cached);

    head(&t, "kvshare_sessions", "gauge", "Open sessions (connections)");
    put(&t, "kvshare_sessions %u\n", (unsigned)srv->sessions.len);
    head(&t, "kvshare_loop_busy_max_seconds", "gauge",
         "The longest stretch of loop work between two polls since start, in seconds");
    put(&t, "kvshare_loop_busy_max_seconds %llu.%06llu\n",
        (unsigned long long)(m->loop_busy_max_us / 1000000),
        (unsigned long long)(m->loop_busy_max_us % 1000000));
    counters(&t, m);

    head(&t, "kvshare_rpc_requests_total", "counter", "Requests by RPC");
    for (size_t r = 0; r < dispatch_count(); r++)
        put(&t, "kvshare_rpc_requests_total{rpc=\"%s\"} %llu\n", dispatch_at(r)->name,
            (unsigned long long)m->rpc_calls[r]);
    head(&t, "kvshare_rpc_errors_total", "counter", "Requests answered with an error, by RPC");
    for (size_t r = 0; r < dispatch_count(); r++)
        put(&t, "kvshare_rpc_errors_total{rpc=\"%s\"} %llu\n", dispatch_at(r)->name,
            (unsigned long long)m->rpc_errors[r]);
    head(&t, "kvshare_rpc_duration_seconds", "histogram",
         "Time to handle one request in the daemon, by RPC (decode to reply built)");
    for (size_t r = 0; r < dispatch_count(); r++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "rpc=\"%s\"", dispatch_at(r)->name);
        hist(&t, "kvshare_rpc_duration_seconds", labels, &m->rpc_latency[r],
             metrics_latency_bounds_ns, metrics_latency_n_bounds, 1e-9);
    }
    head(&t, "kvshare_block_lifetime_seconds", "histogram",
         "Time from a block's commit to its eviction");
    hist(&t, "kvshare_block_lifetime_seconds", "", &m->block_lifetime, metrics_block_bounds_ms,
         metrics_block_n_bounds, 1e-3);
    head(&t, "kvshare_block_reuse_gap_seconds", "histogram",
         "Time since a lookup's matched prefix was last used (committed or matched to its end)");
    hist(&t, "kvshare_block_reuse_gap_seconds", "", &m->block_reuse_gap, metrics_block_bounds_ms,
         metrics_block_n_bounds, 1e-3);
    head(&t, "kvshare_tier_copy_seconds", "histogram",
         "Time one request's batch of copies between the pool and tier 2 took on its thread, "
         "by direction");
    hist(&t, "kvshare_tier_copy_seconds", "direction=\"demote\"",
         &m->tier_copy_time[BACKEND_TO_TIER], metrics_latency_bounds_ns, metrics_latency_n_bounds,
         1e-9);
    hist(&t, "kvshare_tier_copy_seconds", "direction=\"promote\"",
         &m->tier_copy_time[BACKEND_FROM_TIER], metrics_latency_bounds_ns, metrics_latency_n_bounds,
         1e-9);
    if (srv->disk_tier) {
        head(&t, "kvshare_tier3_read_seconds", "histogram",
             "Time one request's batch of reads from tier 3 (the disk) into the pool took, "
             "verification and the copy into the pool included");
        hist(&t, "kvshare_tier3_read_seconds", "", &m->disk_read_time, metrics_latency_bounds_ns,
             metrics_latency_n_bounds, 1e-9);
    }

    if (t.failed) {
        free(t.buf);
        return KVS_ENOMEM;
    }
    *out = t.buf;
    *len = t.len;
    return 0;
}
