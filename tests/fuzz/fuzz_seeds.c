/*
 * Writes the seed corpora of the fuzz targets:
 *
 *   fuzz_seeds DIR      (DIR = tests/fuzz: writes DIR/corpus_session/seed_*
 *                        and DIR/corpus_radix/seed_*)
 *
 * Session seeds are request streams as a worker sends them (the fuzz target's
 * pool is fresh, 32 blocks of 4 tokens, and hands out ids 0, 1, 2, ... and
 * then the last released first), with 0xA5 0x5A between the reads; chunks go
 * to the target's two sessions in turn, and an empty chunk closes one. Radix seeds are operation
 * streams from a fixed generator. The committed corpora were made by this program; libFuzzer grows
 * them in a scratch directory during CI, never in the tree.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frame.h"
#include "kvshare.h"

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

static void lookup(const char *ns, uint32_t base, size_t blocks, int pin)
{
    uint32_t tok[64];
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.ns = (char *)ns;
    lk.tokens = prompt(tok, blocks, base);
    lk.pin = pin;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    send(&req);
}

static void alloc(uint32_t n)
{
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__AllocRequest al = KVSHARE__ALLOC_REQUEST__INIT;
    al.n = n;
    req.rpc_case = KVSHARE__REQUEST__RPC_ALLOC;
    req.alloc = &al;
    send(&req);
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

static void radix_seeds(const char *dir)
{
    static const uint8_t shapes[] = {0x00, 0x81, 0x0a, 0x87, 0x13, 0x04, 0x8f, 0x22};
    for (size_t s = 0; s < sizeof(shapes); s++) {
        raw(&shapes[s], 1);
        /* Bias toward inserts first so later lookups hit. */
        for (int i = 0; i < 600 + 200 * (int)s; i++) {
            uint8_t b = rnd_byte();
            if (i < 120 && i % 3 == 0)
                b = (uint8_t)(1 + 6 * (b % 40)); /* op % 6 == 1: insert */
            raw(&b, 1);
        }
        char name[32];
        snprintf(name, sizeof(name), "seed_ops_%zu", s);
        save(dir, name);
    }
}

int main(int argc, char **argv)
{
    char sdir[1024], rdir[1024];
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR (tests/fuzz)\n");
        return 2;
    }
    snprintf(sdir, sizeof(sdir), "%s/corpus_session", argv[1]);
    snprintf(rdir, sizeof(rdir), "%s/corpus_radix", argv[1]);
    if ((mkdir(sdir, 0755) != 0 && errno != EEXIST) ||
        (mkdir(rdir, 0755) != 0 && errno != EEXIST)) {
        fprintf(stderr, "fuzz_seeds: cannot create %s or %s\n", sdir, rdir);
        return 1;
    }
    session_seeds(sdir);
    radix_seeds(rdir);
    frame_buf_release(&seed);
    return 0;
}
