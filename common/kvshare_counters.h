/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's counters, listed once. Everything that carries a counter is
 * generated from this list: the daemon's metrics_t, the Stats reply (the
 * `counters` array, in list order), the /metrics exposition, kvs_stats_t,
 * `kvshare stats` (text and --json) and the Python binding (through
 * kvs_counter_name). Adding a counter is one line here plus the place that
 * counts it (`srv->metrics.NAME++`) and its test.
 *
 * X(name, named_field, family, labels, help):
 *   name         the C field (metrics_t, kvs_stats_t), the JSON and Python key;
 *   named_field  1 when StatsReply also has a field of that name (the counters
 *                that predate StatsReply.counters; they stay filled for older
 *                clients), 0 for every counter added since: leave it 0;
 *   family       the Prometheus metric (counters of one family share its help),
 *                in base units: a counter kept in milliseconds, microseconds or
 *                nanoseconds ends its name in _ms, _us or _ns and its family in
 *                _seconds_total, and /metrics shows it in seconds;
 *   labels       its label set, "" for none;
 *   help         the family's HELP line.
 *
 * Append only, never reorder or remove: a counter's position is its place
 * in kvs_stats_t (ABI) and in StatsReply.counters (protocol). At most
 * KVS_COUNTER_SLOTS counters: kvs_stats_t keeps room for them so that its
 * size does not change when a counter is added.
 */
#ifndef KVSHARE_COUNTERS_H
#define KVSHARE_COUNTERS_H

/* clang-format off */
#define KVS_COUNTERS(X) \
    X(requests, 1, "kvshare_requests_total", "", \
      "Requests answered, every RPC") \
    X(errors, 1, "kvshare_request_errors_total", "", \
      "Requests answered with an error") \
    X(protocol_errors, 1, "kvshare_protocol_errors_total", "", \
      "Frames refused: too big, undecodable") \
    X(bytes_in, 1, "kvshare_received_bytes_total", "", \
      "Request bytes received") \
    X(bytes_out, 1, "kvshare_sent_bytes_total", "", \
      "Reply bytes sent") \
    X(sessions_total, 1, "kvshare_sessions_total", "", \
      "Sessions accepted since start") \
    X(sessions_refused, 1, "kvshare_sessions_refused_total", "reason=\"limit\"", \
      "Connections refused, by reason") \
    X(peers_denied, 1, "kvshare_sessions_refused_total", "reason=\"denied\"", \
      "Connections refused, by reason") \
    X(sessions_dropped, 1, "kvshare_sessions_dropped_total", "", \
      "Sessions closed because they stopped reading their replies") \
    X(evictions, 1, "kvshare_evictions_total", "", \
      "Cached blocks evicted back to the pool") \
    X(alloc_failures, 1, "kvshare_alloc_failures_total", "reason=\"pool_full\"", \
      "Allocations refused: pool full after eviction (Alloc), namespace quota (Commit)") \
    X(alloc_failures_quota, 1, "kvshare_alloc_failures_total", "reason=\"quota\"", \
      "Allocations refused: pool full after eviction (Alloc), namespace quota (Commit)") \
    X(session_limit_refusals, 1, "kvshare_session_limit_refusals_total", "", \
      "Requests refused for a per-session limit (pinned or writing blocks)") \
    X(namespace_denied, 1, "kvshare_namespace_denied_total", "", \
      "Requests refused by a namespace allow-list") \
    X(config_reloads, 1, "kvshare_config_reloads_total", "result=\"ok\"", \
      "SIGHUP reloads, by result") \
    X(config_reload_errors, 1, "kvshare_config_reloads_total", "result=\"error\"", \
      "SIGHUP reloads, by result") \
    X(pin_misses, 0, "kvshare_pin_misses_total", "", \
      "Pins refused because the block is no longer cached (evicted since its lookup)") \
    X(lookup_waits, 0, "kvshare_lookup_waits_total", "result=\"done\"", \
      "Lookups that waited for blocks other sessions were writing, by how the wait ended") \
    X(lookup_wait_timeouts, 0, "kvshare_lookup_waits_total", "result=\"deadline\"", \
      "Lookups that waited for blocks other sessions were writing, by how the wait ended") \
    X(lookup_wait_ms, 0, "kvshare_lookup_wait_seconds_total", "", \
      "Seconds lookups spent waiting for blocks other sessions were writing") \
    X(kv_events_published, 0, "kvshare_kv_events_published_total", "", \
      "KV events sent to routers (BlockStored, BlockRemoved, AllBlocksCleared)") \
    X(kv_events_dropped, 0, "kvshare_kv_events_dropped_total", "", \
      "KV events dropped because the publisher's queue was full (kv_events_queue)") \
    X(kv_events_replay_requests, 0, "kvshare_kv_events_replay_requests_total", "", \
      "Replay requests answered on the KV events replay socket") \
    X(sessions_refused_fds, 0, "kvshare_sessions_refused_total", "reason=\"descriptors\"", \
      "Connections refused, by reason") \
    X(sessions_dropped_memory, 0, "kvshare_sessions_dropped_memory_total", "", \
      "Sessions closed because the session buffers went over max_buffer_memory") \
    X(sessions_idle_closed, 0, "kvshare_sessions_idle_closed_total", "", \
      "Sessions closed after idle_timeout_ms without a request") \
    X(clears, 0, "kvshare_clears_total", "", \
      "Clear requests served (a namespace's unpinned cached blocks dropped)") \
    X(cleared_blocks, 0, "kvshare_cleared_blocks_total", "", \
      "Cached blocks dropped by Clear requests (also counted in evictions)") \
    X(namespaces_reclaimed, 0, "kvshare_namespaces_reclaimed_total", "", \
      "Dynamic namespaces deleted because they held nothing when the namespace table was full") \
    X(namespace_session_refusals, 0, "kvshare_namespace_create_refusals_total", \
      "reason=\"session_limit\"", "Namespaces not created, by reason") \
    X(namespace_table_refusals, 0, "kvshare_namespace_create_refusals_total", \
      "reason=\"table_full\"", "Namespaces not created, by reason") \
    X(tier_demotions, 0, "kvshare_tier_demotions_total", "", \
      "Blocks copied from the pool to tier 2 (host memory) instead of being evicted") \
    X(tier_promotions, 0, "kvshare_tier_promotions_total", "", \
      "Blocks copied back from tier 2 to the pool for a pinned lookup") \
    X(tier_drops_t1, 0, "kvshare_tier_demote_drops_total", "", \
      "Blocks evicted from the pool while demoting because tier 2 had no room for them") \
    X(tier_copied_bytes, 0, "kvshare_tier_copied_bytes_total", "", \
      "Bytes copied between the pool and tier 2, both ways") \
    X(tier2_drops, 0, "kvshare_tier2_drops_total", "", \
      "Blocks dropped for good below the pool (part of evictions): from tier 2 when it was " \
      "full, or with a disk tier from tier 3") \
    X(tier_copy_us, 0, "kvshare_tier_copy_seconds_total", "", \
      "Seconds the copies between the pool and tier 2 took, on the copying threads") \
    X(tier_copy_failures, 0, "kvshare_tier_copy_failures_total", "", \
      "Batches of copies between the pool and tier 2 that failed (kvshared then stops)") \
    X(tier2_in_place_blocks, 0, "kvshare_tier2_in_place_blocks_total", "", \
      "Tier-2 blocks that lookups with tier2_in_place returned pinned where they are, " \
      "for the worker to copy itself") \
    X(requests_spaced, 0, "kvshare_requests_spaced_total", "", \
      "Times a request of 1 MiB or more, or a whole-index walk (Tree), was held back so that " \
      "such work takes at most 1 % of the loop") \
    X(claims_expired, 0, "kvshare_claims_expired_total", "", \
      "Claims of a Lookup's missing blocks that ended because their session sent no request " \
      "for the claim lease (1 s): lookups waiting for them stop waiting") \
    X(metrics_http_closed_limit, 0, "kvshare_metrics_http_closed_total", "reason=\"limit\"", \
      "/metrics connections closed by the daemon, by reason") \
    X(metrics_http_closed_deadline, 0, "kvshare_metrics_http_closed_total", \
      "reason=\"deadline\"", "/metrics connections closed by the daemon, by reason") \
    X(metrics_http_scrapes_held, 0, "kvshare_metrics_http_scrapes_held_total", "", \
      "Scrapes held for the next render, so that rendering takes at most 5 % of the loop") \
    X(kv_events_replay_refused, 0, "kvshare_kv_events_replay_refused_total", "", \
      "Replay requests refused: over a peer's share (one at a time, one per 100 ms) or too " \
      "many replays at once") \
    X(kv_events_replay_stalled, 0, "kvshare_kv_events_replay_stalled_total", "", \
      "Replays ended because their peer took nothing for 5 s") \
    X(kv_events_send_drops, 0, "kvshare_kv_events_send_drops_total", "", \
      "KV events batches not sent to subscribers because the queued messages held " \
      "kv_events_send_bytes (kept for replay)") \
    X(cluster_puts, 0, "kvshare_cluster_puts_total", "", \
      "Blocks of shared namespaces written through to the cluster tier at commit") \
    X(cluster_put_drops, 0, "kvshare_cluster_put_drops_total", "", \
      "Blocks of shared namespaces not written to the cluster tier: too many writes in flight, " \
      "or the cluster refused them at once") \
    X(cluster_fetched_blocks, 0, "kvshare_cluster_fetched_blocks_total", "", \
      "Blocks a Lookup missed locally that came from the cluster tier into the pool") \
    X(cluster_fetch_misses, 0, "kvshare_cluster_fetch_misses_total", "", \
      "Blocks a Lookup asked the cluster tier for that did not come (absent, late, corrupt, " \
      "or no free pool block)") \
    X(cluster_timeouts, 0, "kvshare_cluster_timeouts_total", "", \
      "Cluster commands not answered within cluster_timeout_ms (each ends its node's connection)") \
    X(cluster_node_errors, 0, "kvshare_cluster_node_errors_total", "", \
      "Cluster commands that failed because their node was down, lost, or the cluster was down") \
    X(cluster_auth_errors, 0, "kvshare_cluster_auth_errors_total", "", \
      "AUTH refused by a cluster node, and commands refused for want of it") \
    X(cluster_redirects, 0, "kvshare_cluster_redirects_total", "", \
      "MOVED and ASK redirects the cluster client followed") \
    X(cluster_map_refreshes, 0, "kvshare_cluster_map_refreshes_total", "", \
      "Slot maps read from the cluster (CLUSTER SLOTS)") \
    X(cluster_bad_values, 0, "kvshare_cluster_bad_values_total", "", \
      "Values read from the cluster that did not verify or named another block (misses, " \
      "never served)") \
    X(cluster_bytes_out, 0, "kvshare_cluster_bytes_out_total", "", \
      "Bytes of commands sent to the cluster (values written included)") \
    X(cluster_bytes_in, 0, "kvshare_cluster_bytes_in_total", "", \
      "Bytes of values read from the cluster") \
    X(hints_refused, 0, "kvshare_hints_refused_total", "", \
      "Timed retention hints ignored because max_timed_hints blocks already hold one") \
    X(clears_denied, 0, "kvshare_clears_denied_total", "", \
      "Clear requests refused: the session may not clear that namespace (clear_uids, " \
      "clear_gids, or the namespace's allow-list)") \
    X(disk_reads, 0, "kvshare_disk_reads_total", "", \
      "Blocks read back from the disk tier (tier 3) into the pool and verified") \
    X(disk_crc_failures, 0, "kvshare_disk_crc_failures_total", "", \
      "Disk tier reads of a slot whose record did not verify (misses, never served)") \
    X(loop_stalls, 0, "kvshare_loop_stalls_total", "", \
      "Stretches of loop work between two polls longer than 50 ms (every client waited)")
/* clang-format on */

/* Room for counters in kvs_stats_t and StatsReply.counters. */
#define KVS_COUNTER_SLOTS 64

/* Counters added once KVS_COUNTERS filled kvs_stats_t's room: the daemon
 * keeps them, /metrics exposes them and StatsReply.counters carries them
 * after KVS_COUNTERS' (the protocol's array may grow), but kvs_stats_t
 * has no field for them until the next SOVERSION, which moves them into
 * KVS_COUNTERS. Same columns as KVS_COUNTERS; append only. */
/* clang-format off */
#define KVS_COUNTERS_NEXT(X) \
    X(identity_refusals, 0, "kvshare_identity_refusals_total", "", \
      "Hellos and requests refused: they declared another model identity than their " \
      "namespace holds (docs/OPERATING.md, Model identity)") \
    X(cluster_identity_misses, 0, "kvshare_cluster_identity_misses_total", "", \
      "Values read from the cluster that verified but named another model identity (misses, " \
      "never served; not counted in kvshare_cluster_bad_values_total)") \
    X(cluster_keys_deleted, 0, "kvshare_cluster_keys_deleted_total", "", \
      "Keys of a shared namespace deleted from the cluster by a Clear (cluster_clear)") \
    X(cluster_clears_incomplete, 0, "kvshare_cluster_clears_incomplete_total", "", \
      "Clears of a shared namespace in the cluster that ended with keys left: " \
      "cluster_clear_timeout_ms passed, or the cluster was unreachable (logged)") \
    X(disk_identity_dropped, 0, "kvshare_disk_identity_dropped_total", "", \
      "Disk tier records not restored at start: their model identity is not their " \
      "namespace's now, or the file does not name it (their slots are free)") \
    X(disk_deleted_dropped, 0, "kvshare_disk_deleted_dropped_total", "", \
      "Disk tier records not restored at start: a Clear or an Evict deleted them") \
    X(cluster_oom_refusals, 0, "kvshare_cluster_oom_refusals_total", "", \
      "Cluster commands refused with OOM: a node at its maxmemory that may not evict (writes " \
      "lost; logged at most once a second)") \
    X(cluster_replies_cut, 0, "kvshare_cluster_replies_cut_total", "", \
      "Cluster replies larger than any command kvshared sends can need (a block's value, or " \
      "the bound of a SCAN or CLUSTER SLOTS reply): cut off, their connection closed (logged)")
/* clang-format on */

/* KVS_COUNTER_<name>: a counter's position in the list; KVS_N_COUNTERS. */
#define KVS__COUNTER_ENUM(name, ...) KVS_COUNTER_##name,
enum { KVS_COUNTERS(KVS__COUNTER_ENUM) KVS_N_COUNTERS };
/* KVS_COUNTERS then KVS_COUNTERS_NEXT: KVS_N_COUNTERS_ALL in all. */
enum {
    KVS__COUNTER_NEXT_BASE = KVS_N_COUNTERS - 1,
    KVS_COUNTERS_NEXT(KVS__COUNTER_ENUM) KVS_N_COUNTERS_ALL
};
#undef KVS__COUNTER_ENUM

#endif /* KVSHARE_COUNTERS_H */
