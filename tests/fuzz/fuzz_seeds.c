/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the seed corpora of the fuzz targets:
 *
 *   fuzz_seeds DIR      (DIR = tests/fuzz: writes DIR/corpus_session/seed_*,
 *                        DIR/corpus_radix/seed_*, DIR/corpus_client/seed_*,
 *                        DIR/corpus_lookup_codec/seed_*)
 *
 * Session seeds are request streams as a worker sends them (the fuzz
 * target's pool is fresh, 32 blocks of 4 tokens, and hands out ids 0, 1, 2,
 * ... and then the last released first), with 0xA5 0x5A between the reads;
 * chunks go to the target's two sessions in turn, and an empty chunk closes
 * one. Radix seeds are operation streams from a fixed generator, some
 * random, some (seed_tier_*) shaped to reach the tier-2 steps. Client seeds
 * are a daemon's replies to fuzz_client's calls. Lookup codec seeds are the bodies
 * of single requests, Lookups and one Ping. The committed corpora were
 * made by this program; libFuzzer grows them in a scratch directory during
 * CI, never in the tree.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frame.h"
#include "kvshare_status.h"
#include "kvshare_version.h"

#define SEED_BT 4

static frame_buf_t seed;
static uint64_t next_id;

static void raw(const void *p, size_t n)
{
    if (frame_buf_reserve(&seed, n) != 0)
        abort();
    memcpy(seed.data + seed.len, p, n);
    seed.len += n;
}

/* Ends one read: the next chunk goes to the other session. */
static void cut(void)
{
    static const uint8_t marker[2] = {0xA5, 0x5A};
    raw(marker, 2);
}

static void send(Kvshare__Request *req)
{
    req->id = ++next_id;
    if (frame_append_request(&seed, req) != 0)
        abort();
}

static ProtobufCBinaryData prompt(uint32_t *buf, size_t blocks, uint32_t base)
{
    for (size_t i = 0; i < blocks * SEED_BT; i++)
        buf[i] = base * 1000 + (uint32_t)i;
    ProtobufCBinaryData b = {blocks * SEED_BT * 4, (uint8_t *)buf};
    return b;
}

static void hello(const char *worker)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__HelloRequest h = KVSHARE__HELLO_REQUEST__INIT;
    h.version = KVS_PROTOCOL_VERSION;
    h.worker = (char *)worker;
    req.rpc_case = KVSHARE__REQUEST__RPC_HELLO;
    req.hello = &h;
    send(&req);
}

/* A Lookup; with wait_ms, pinned, it waits for blocks in flight. */
static void lookup_for(const char *ns, uint32_t base, size_t blocks, int pin, uint32_t wait_ms)
{
    uint32_t tok[64];
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.ns = (char *)ns;
    lk.tokens = prompt(tok, blocks, base);
    lk.pin = pin;
    lk.wait_ms = wait_ms;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    send(&req);
}

static void lookup(const char *ns, uint32_t base, size_t blocks, int pin)
{
    lookup_for(ns, base, blocks, pin, 0);
}

static void lookup_wait(const char *ns, uint32_t base, size_t blocks)
{
    lookup_for(ns, base, blocks, 1, 60000);
}

/* An Alloc of n blocks; with ns, it names the prompt they will hold
 * (declared in flight, inflight.h). */
static void alloc_for(const char *ns, uint32_t base, uint32_t n)
{
    uint32_t tok[64];
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    if (ns) {
        al.ns = (char *)ns;
        al.tokens = prompt(tok, n, base);
    }
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    send(&req);
}

static void alloc(uint32_t n)
{
    alloc_for(NULL, 0, n);
}

static void commit(const char *ns, uint32_t base, size_t blocks, uint32_t *ids, size_t n_ids)
{
    uint32_t tok[64];
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__CommitRequest cm = KVSHARE__COMMIT_REQUEST__INIT;
    cm.ns = (char *)ns;
    cm.tokens = prompt(tok, blocks, base);
    cm.n_block_ids = n_ids;
    cm.block_ids = ids;
    req.rpc_case = KVSHARE__REQUEST__RPC_COMMIT;
    req.commit = &cm;
    send(&req);
}

static void ids_rpc(int pin, uint32_t *ids, size_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__PinRequest pr = KVSHARE__PIN_REQUEST__INIT;
    Kvshare__ReleaseRequest rl = KVSHARE__RELEASE_REQUEST__INIT;
    if (pin) {
        pr.n_block_ids = n;
        pr.block_ids = ids;
        req.rpc_case = KVSHARE__REQUEST__RPC_PIN;
        req.pin = &pr;
    } else {
        rl.n_block_ids = n;
        rl.block_ids = ids;
        req.rpc_case = KVSHARE__REQUEST__RPC_RELEASE;
        req.release = &rl;
    }
    send(&req);
}

static void stats_tree_ping(void)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__StatsRequest st = KVSHARE__STATS_REQUEST__INIT;
    Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
    Kvshare__PingRequest pg = KVSHARE__PING_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_STATS;
    req.stats = &st;
    send(&req);
    tr.max = 5;
    req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
    req.tree = &tr;
    send(&req);
    tr.by_size = 1;
    tr.ns = "default";
    send(&req);
    static uint8_t payload[16] = "ping";
    pg.payload.data = payload;
    pg.payload.len = sizeof(payload);
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &pg;
    send(&req);
}

static void save(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(seed.data, 1, seed.len, f) != seed.len || fclose(f) != 0) {
        fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
        exit(1);
    }
    frame_buf_reset(&seed);
    next_id = 0;
}

static void session_seeds(const char *dir)
{
    uint32_t ids[32];

    /* One worker: miss, alloc, commit, hit, release everything. */
    hello("w");
    lookup("", 1, 3, 1);
    alloc(3);
    ids[0] = 0, ids[1] = 1, ids[2] = 2;
    commit("", 1, 3, ids, 3);
    lookup("", 1, 3, 1);
    ids_rpc(0, ids, 3);
    ids_rpc(0, ids, 3);
    stats_tree_ping();
    save(dir, "seed_worker_lifecycle");

    /* Two workers share a prefix; the first leaves holding its pins. */
    hello("a");
    alloc(2);
    ids[0] = 0, ids[1] = 1;
    commit("", 2, 2, ids, 2);
    cut();
    hello("b");
    lookup("", 2, 4, 1);
    ids_rpc(1, ids, 2);
    ids_rpc(0, ids, 2);
    cut();
    ids_rpc(0, ids, 1);
    cut();
    ids_rpc(0, ids, 2);
    save(dir, "seed_shared_prefix");

    /* Both commit the same prefix: the second gets the first's blocks and
     * keeps its own WRITING until it releases them. */
    alloc(2);
    ids[0] = 0, ids[1] = 1;
    commit("", 3, 2, ids, 2);
    cut();
    alloc(2);
    ids[0] = 2, ids[1] = 3;
    commit("", 3, 2, ids, 2);
    ids_rpc(0, ids, 2);
    ids[0] = 0, ids[1] = 1;
    ids_rpc(0, ids, 2);
    save(dir, "seed_duplicate_commit");

    /* The pool fills with pinned blocks: the next alloc gets EPOOLFULL;
     * after a release, eviction makes room. */
    alloc(16);
    for (uint32_t i = 0; i < 16; i++)
        ids[i] = i;
    commit("", 4, 16, ids, 16);
    alloc(16);
    alloc(1);
    ids_rpc(0, ids, 16);
    alloc(1);
    save(dir, "seed_pool_full");

    /* Foreign and bad ids: another session's WRITING block, a free one, out
     * of range, twice in one commit. */
    alloc(2);
    cut();
    ids[0] = 0;
    ids_rpc(0, ids, 1);
    commit("", 5, 1, ids, 1);
    cut();
    ids[0] = 999;
    ids_rpc(0, ids, 1);
    ids_rpc(1, ids, 1);
    ids[0] = 1, ids[1] = 1;
    commit("", 5, 2, ids, 2);
    ids[0] = 7;
    ids_rpc(0, ids, 1);
    commit("", 5, 1, ids, 1);
    save(dir, "seed_foreign_ids");

    /* Namespaces up to the limit, a commit into one, and an unknown one. */
    for (uint32_t k = 0; k < 10; k++) {
        char ns[16];
        snprintf(ns, sizeof(ns), "tenant%u", k);
        lookup(ns, 6, 1, 0);
    }
    alloc(1);
    ids[0] = 0;
    commit("tenant1", 6, 1, ids, 1);
    lookup("tenant1", 6, 1, 1);
    {
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        Kvshare__TreeRequest tr = KVSHARE__TREE_REQUEST__INIT;
        tr.ns = "nobody";
        req.rpc_case = KVSHARE__REQUEST__RPC_TREE;
        req.tree = &tr;
        send(&req);
    }
    save(dir, "seed_namespaces");

    /* A worker hangs up (an empty chunk) holding pins and WRITING blocks
     * while another holds pins on the same blocks. */
    hello("a");
    alloc(3);
    ids[0] = 0, ids[1] = 1, ids[2] = 2;
    commit("", 9, 2, ids, 2);
    lookup("", 9, 2, 1);
    cut();
    lookup("", 9, 2, 1);
    cut();
    cut();
    ids[0] = 0, ids[1] = 1;
    ids_rpc(0, ids, 2);
    cut();
    alloc(32);
    save(dir, "seed_hang_up_holding");

    /* A request split over many reads, one byte each. */
    {
        hello("slow");
        frame_buf_t whole = seed;
        memset(&seed, 0, sizeof(seed));
        lookup("", 8, 2, 0);
        frame_buf_t one = seed;
        memset(&seed, 0, sizeof(seed));
        raw(whole.data, whole.len);
        for (size_t i = 0; i < one.len; i++) {
            raw(one.data + i, 1);
            cut();
            cut(); /* an empty chunk for the other session */
        }
        frame_buf_release(&whole);
        frame_buf_release(&one);
    }
    save(dir, "seed_byte_by_byte");

    /* Streams the daemon must refuse: an empty Request (no RPC), Hello
     * twice, then a body that does not decode. */
    {
        Kvshare__Request req = KVSHARE__REQUEST__INIT;
        send(&req);
        hello("x");
        hello("x");
        static const uint8_t junk[] = {6, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
        raw(junk, sizeof(junk));
        cut();
        lookup("", 1, 1, 0);
    }
    save(dir, "seed_refused_streams");

    /* A length prefix over the limit. */
    {
        static const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3};
        raw(huge, sizeof(huge));
    }
    save(dir, "seed_frame_too_big");

    /* A lookup waits for a prefix the other session computes, with a
     * request pipelined behind it; the writer's Commit answers both. */
    alloc_for("default", 6, 2);
    cut();
    lookup_wait("default", 6, 2);
    stats_tree_ping();
    cut();
    ids[0] = 0, ids[1] = 1;
    commit("default", 6, 2, ids, 2);
    ids_rpc(0, ids, 2);
    cut();
    ids_rpc(0, ids, 2);
    save(dir, "seed_wait_for_commit");

    /* The same with garbage behind the waiting lookup: the waiter's stream
     * breaks inside the writer's Commit. */
    alloc_for("default", 7, 2);
    cut();
    lookup_wait("default", 7, 2);
    {
        static const uint8_t junk[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
        raw(junk, sizeof(junk));
    }
    cut();
    ids[0] = 0, ids[1] = 1;
    commit("default", 7, 2, ids, 2);
    cut();
    lookup("default", 7, 2, 1);
    save(dir, "seed_wait_then_garbage");
}

static void reply(Kvshare__Response *resp)
{
    resp->id = ++next_id;
    if (frame_append_response(&seed, resp) != 0)
        abort();
}

/* What a daemon answers to fuzz_client's calls, in their order. */
static void client_seeds(const char *dir)
{
    uint32_t ids[4] = {0, 1, 2, 3};
    for (int variant = 0; variant < 3; variant++) {
        Kvshare__Response r = KVSHARE__RESPONSE__INIT;
        Kvshare__HelloReply h = KVSHARE__HELLO_REPLY__INIT;
        Kvshare__Geometry g = KVSHARE__GEOMETRY__INIT;
        g.layers = 2, g.kv_heads = 2, g.head_dim = 8, g.dtype = "fp16", g.dtype_bytes = 2;
        g.block_tokens = SEED_BT;
        h.version = KVS_PROTOCOL_VERSION;
        h.geometry = &g;
        h.num_blocks = 64;
        h.block_bytes = 512;
        h.slot_bytes = 128;
        h.backend = KVSHARE__BACKEND__BACKEND_HOST;
        r.rpc_case = KVSHARE__RESPONSE__RPC_HELLO;
        r.hello = &h;
        reply(&r);

        Kvshare__LookupReply lk = KVSHARE__LOOKUP_REPLY__INIT;
        lk.n_block_ids = variant == 1 ? 3 : 1; /* 3: more than asked, the client releases */
        lk.block_ids = ids;
        lk.hit_tokens = (uint32_t)lk.n_block_ids * SEED_BT;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
        r.lookup = &lk;
        reply(&r);
        if (variant == 1) {
            Kvshare__ReleaseReply rl = KVSHARE__RELEASE_REPLY__INIT;
            rl.n_released = 1;
            r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
            r.rpc_case = KVSHARE__RESPONSE__RPC_RELEASE;
            r.release = &rl;
            reply(&r);
        }

        Kvshare__AllocReply al = KVSHARE__ALLOC_REPLY__INIT;
        al.n_block_ids = 3;
        al.block_ids = ids;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_ALLOC;
        r.alloc = &al;
        if (variant == 2) {
            r.status = KVSHARE__STATUS__KVS_EPOOLFULL;
            r.message = "pool full: 3 blocks wanted, 0 free";
            r.rpc_case = KVSHARE__RESPONSE__RPC__NOT_SET;
        }
        reply(&r);

        Kvshare__CommitReply cm = KVSHARE__COMMIT_REPLY__INIT;
        cm.n_canonical = 3;
        cm.canonical = ids;
        cm.n_committed = 3;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_COMMIT;
        r.commit = &cm;
        reply(&r);

        Kvshare__PinReply pn = KVSHARE__PIN_REPLY__INIT;
        pn.n_pinned = 3;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_PIN;
        r.pin = &pn;
        reply(&r);

        Kvshare__ReleaseReply rl = KVSHARE__RELEASE_REPLY__INIT;
        rl.n_released = 3;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_RELEASE;
        r.release = &rl;
        reply(&r);

        Kvshare__StatsReply st = KVSHARE__STATS_REPLY__INIT;
        Kvshare__NamespaceStats ns = KVSHARE__NAMESPACE_STATS__INIT, *nsp = &ns;
        ns.name = "default";
        ns.lookups = 5;
        st.total_blocks = 64;
        st.free_blocks = 60;
        st.cached_blocks = 4;
        st.n_namespaces = 1;
        st.namespaces = &nsp;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_STATS;
        r.stats = &st;
        reply(&r);

        Kvshare__TreeReply tr = KVSHARE__TREE_REPLY__INIT;
        Kvshare__Prefix px = KVSHARE__PREFIX__INIT, *pxp[5] = {&px, &px, &px, &px, &px};
        px.ns = "default";
        px.tokens = 8;
        px.blocks = 2;
        tr.n_prefixes = variant == 1 ? 5 : 1;
        tr.prefixes = pxp;
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_TREE;
        r.tree = &tr;
        reply(&r);

        Kvshare__PingReply pg = KVSHARE__PING_REPLY__INIT;
        static uint8_t payload[8];
        pg.payload.data = payload;
        pg.payload.len = sizeof(payload);
        r = (Kvshare__Response)KVSHARE__RESPONSE__INIT;
        r.rpc_case = KVSHARE__RESPONSE__RPC_PING;
        r.ping = &pg;
        reply(&r);

        char name[32];
        snprintf(name, sizeof(name), "seed_replies_%d", variant);
        save(dir, name);
    }

    /* A refusal (id 0) instead of the Hello reply. */
    {
        Kvshare__Response r = KVSHARE__RESPONSE__INIT;
        r.status = KVSHARE__STATUS__KVS_ELIMIT;
        r.message = "kvshared has reached its session limit";
        if (frame_append_response(&seed, &r) != 0)
            abort();
        save(dir, "seed_refused");
    }
}

/* xorshift: a fixed stream, so the seeds are the same on every run. */
static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint8_t rnd_byte(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 24);
}

static void byte(uint8_t b)
{
    raw(&b, 1);
}

/* fuzz_radix's step encoding (tests/fuzz/fuzz_radix.c): an opcode (low 3
 * bits: the operation), then ns + 4 x blocks, then the prompt's token bytes
 * (four 2-bit tokens each), then the operation's own bytes. */
static void r_no_prompt(uint8_t index)
{
    /* ns and a held or copy index; (arg >> 2) % 9 == 0 blocks: no token bytes */
    byte((uint8_t)((index / 4 % 4) * 36 + index % 4));
}

enum {
    R_INSERT_ROOM = 0x81,
    R_PIN_ANY = 0x03,
    R_HINT = 0x06,
    R_DEMOTE = 0x07,
    R_PROMOTE = 0x0f,
    R_COPY_DONE = 0x17,
    R_UNPIN_HELD = 0x04,
    R_LOOKUP_PIN = 0x10
};

static void r_prompt(uint32_t ns, uint32_t blocks, uint32_t bt, const uint8_t *tokens)
{
    byte((uint8_t)(ns + 4 * blocks));
    for (uint32_t k = 0; k < (blocks * bt + 3) / 4; k++)
        byte(tokens[k]);
}

/* A tier-2 seed: prompts that share prefixes inserted into a full pool (so
 * inserts demote), copies ended, then the prompts looked up again with
 * promotion to random tier-1 ids, demotions and copy ends interleaved, pins
 * and hints on any id of either tier, and pins let go. */
static void radix_tier_seed(uint8_t shape, uint8_t tier, uint32_t bt, uint32_t pool)
{
    enum { PROMPTS = 12, MAX_TOKEN_BYTES = 8 * 16 / 4 };
    static uint8_t tok[PROMPTS][MAX_TOKEN_BYTES];
    uint32_t blocks[PROMPTS];
    byte(shape);
    byte(tier);
    for (uint32_t p = 0; p < PROMPTS; p++) {
        blocks[p] = 2 + p % 6;
        for (uint32_t k = 0; k < MAX_TOKEN_BYTES; k++) /* prompts share the first bytes */
            tok[p][k] = k < 2 * bt / 4 + 1 && p % 3 ? tok[0][k] : rnd_byte();
    }
    uint32_t next_id = 0;
    for (int round = 0; round < 3; round++) {
        for (uint32_t p = 0; p < PROMPTS; p++) {
            byte(R_INSERT_ROOM);
            r_prompt(p % 3, blocks[p], bt, tok[p]);
            for (uint32_t k = 0; k < blocks[p]; k++)
                byte((uint8_t)(next_id++ % pool));
            for (int k = 0; k < 2; k++) {
                byte(R_COPY_DONE);
                r_no_prompt(rnd_byte());
                byte(rnd_byte()); /* the id, were none in flight */
            }
        }
        for (uint32_t p = 0; p < PROMPTS; p++) {
            uint32_t q = (p * 5 + (uint32_t)round) % PROMPTS;
            byte(R_DEMOTE);
            r_prompt(q % 3, 0, bt, tok[q]);
            byte(4);
            for (int k = 0; k < 4; k++) {
                byte(R_COPY_DONE);
                r_no_prompt(rnd_byte());
                byte(rnd_byte());
            }
            byte(R_PROMOTE);
            r_prompt(q % 3, blocks[q], bt, tok[q]);
            for (int k = 0; k < 8; k++)
                byte((uint8_t)(rnd_byte() % pool));
            byte(R_PIN_ANY);
            r_no_prompt(0);
            byte(rnd_byte()); /* any id of either tier */
            byte(R_HINT);
            byte((uint8_t)(q % 3));
            byte(rnd_byte() % 8); /* the clock */
            byte(rnd_byte());     /* the id */
            byte(rnd_byte());     /* the priority */
            byte(R_LOOKUP_PIN);
            r_prompt(q % 3, blocks[q], bt, tok[q]);
            for (int k = 0; k < 3; k++) {
                byte(R_COPY_DONE);
                r_no_prompt(rnd_byte());
                byte(rnd_byte());
                byte(R_UNPIN_HELD);
                r_no_prompt(rnd_byte());
                byte(rnd_byte());
            }
        }
    }
}

static void radix_seeds(const char *dir)
{
    static const uint8_t shapes[] = {0x00, 0x81, 0x0a, 0x87, 0x13, 0x04, 0x8f, 0x22};
    /* byte 1, the tier 2: none, smaller than the pool, as large, larger */
    static const uint8_t tiers[] = {0x00, 0x01, 0x02, 0x07, 0x04, 0x22, 0x0d, 0x13};
    for (size_t s = 0; s < sizeof(shapes); s++) {
        raw(&shapes[s], 1);
        raw(&tiers[s], 1);
        /* Bias toward inserts first so later lookups hit. */
        for (int i = 0; i < 600 + 200 * (int)s; i++) {
            uint8_t b = rnd_byte();
            if (i < 120 && i % 3 == 0)
                b = (uint8_t)(1 + 8 * (b % 32)); /* op % 8 == 1: insert */
            raw(&b, 1);
        }
        char name[32];
        snprintf(name, sizeof(name), "seed_ops_%zu", s);
        save(dir, name);
    }
    /* Tier 2 smaller (4, 3), as large and larger (16, 58) than pools of
     * 12, 16 and 48 blocks (shape: block tokens [shape % 5] of 1, 2, 3, 4,
     * 16; pool 8 + (shape >> 2) % 64; 0x80, the colliding hash). */
    static const struct {
        uint8_t shape, tier;
        uint32_t bt, pool;
    } tiered[] = {{0x10, 0x0d, 2, 12}, {0x10, 0x02, 2, 12}, {0x10, 0x0f, 2, 12},
                  {0x23, 0x09, 1, 16}, {0x23, 0x02, 1, 16}, {0xa0, 0x27, 1, 48}};
    for (size_t s = 0; s < sizeof(tiered) / sizeof(tiered[0]); s++) {
        radix_tier_seed(tiered[s].shape, tiered[s].tier, tiered[s].bt, tiered[s].pool);
        char name[32];
        snprintf(name, sizeof(name), "seed_tier_%zu", s);
        save(dir, name);
    }
}

/* One request's or reply's body, without its frame header: a
 * fuzz_lookup_codec seed. */
static void lookup_codec_seed_msg(const char *dir, const char *name, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    if (frame_buf_reserve(&seed, n) != 0)
        abort();
    protobuf_c_message_pack(m, seed.data);
    seed.len = n;
    save(dir, name);
}

static void lookup_codec_seed(const char *dir, const char *name, Kvshare__Request *req)
{
    lookup_codec_seed_msg(dir, name, &req->base);
}

static void lookup_codec_seeds(const char *dir)
{
    uint32_t tok[64];
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    lookup_codec_seed(dir, "seed_lookup_empty", &req);
    req.id = 300;
    lk.tokens = prompt(tok, 16, 7);
    lookup_codec_seed(dir, "seed_lookup", &req);
    lk.ns = "chat";
    lk.pin = 1;
    lk.wait_ms = 60000;
    lk.tier2_in_place = 1;
    req.id = UINT64_MAX;
    lookup_codec_seed(dir, "seed_lookup_all_fields", &req);
    Kvshare__PingRequest ping = KVSHARE__PING_REQUEST__INIT;
    req.rpc_case = KVSHARE__REQUEST__RPC_PING;
    req.ping = &ping;
    lookup_codec_seed(dir, "seed_ping", &req);
    /* A Lookup reply, as the client reads it in place. */
    uint32_t ids[6] = {7, 8, 9, 10, 3, 4};
    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    Kvshare__LookupReply lr = KVSHARE__LOOKUP_REPLY__INIT;
    lr.n_block_ids = 4;
    lr.block_ids = ids;
    lr.n_tier2_block_ids = 2;
    lr.tier2_block_ids = ids + 4;
    lr.hit_tokens = 96;
    lr.inflight_blocks = 1;
    lr.waited = 1;
    resp.id = 300;
    resp.rpc_case = KVSHARE__RESPONSE__RPC_LOOKUP;
    resp.lookup = &lr;
    lookup_codec_seed_msg(dir, "seed_lookup_reply", &resp.base);
}

int main(int argc, char **argv)
{
    char sdir[1024], rdir[1024], cdir[1024], wdir[1024];
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR (tests/fuzz)\n");
        return 2;
    }
    snprintf(sdir, sizeof(sdir), "%s/corpus_session", argv[1]);
    snprintf(rdir, sizeof(rdir), "%s/corpus_radix", argv[1]);
    snprintf(cdir, sizeof(cdir), "%s/corpus_client", argv[1]);
    snprintf(wdir, sizeof(wdir), "%s/corpus_lookup_codec", argv[1]);
    if ((mkdir(sdir, 0755) != 0 && errno != EEXIST) ||
        (mkdir(rdir, 0755) != 0 && errno != EEXIST) ||
        (mkdir(cdir, 0755) != 0 && errno != EEXIST) ||
        (mkdir(wdir, 0755) != 0 && errno != EEXIST)) {
        fprintf(stderr, "fuzz_seeds: cannot create the corpus directories under %s\n", argv[1]);
        return 1;
    }
    session_seeds(sdir);
    radix_seeds(rdir);
    client_seeds(cdir);
    lookup_codec_seeds(wdir);
    frame_buf_release(&seed);
    return 0;
}
