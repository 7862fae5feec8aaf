/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's file (tier_disk.h): superblock, record encoding and
 * checking, the slot allocator and its LRU, and the scan that a warm restart
 * rebuilds from. The I/O engines are in tier_disk_io.c.
 */
#include "tier_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "kvshare_status.h"
#include "log.h"
#include "tier_disk_impl.h"

#define SB_MAGIC  0x3352454954535653ull /* "SVSTIER3" little endian */
#define REC_MAGIC 0x5253564Bu           /* "KVSR" */

/* Record header offsets (TIER_DISK_HDR_FIXED bytes, then the tokens). */
enum {
    H_MAGIC = 0,
    H_FORMAT = 4,
    H_SEQ = 8,
    H_HASH = 16,
    H_NSID = 24,
    H_NTOK = 28,
    H_LEN = 32,
    H_SLOT = 36,
    H_CRC = 40,
    H_PARENT = 48, /* format 2: the chained hash this block chains from */
    H_NS = 56,
    H_TOKENS = TIER_DISK_HDR_FIXED,
};

/* Superblock offsets. */
enum {
    S_MAGIC = 0,
    S_FORMAT = 8,
    S_TOKENS = 12,
    S_BLOCK = 16,
    S_GEO = 24,
    S_SLOT = 32,
    S_NSLOTS = 40,
    S_CRC = 48,
};

_Static_assert(H_NS + TIER_DISK_NS_MAX == TIER_DISK_HDR_FIXED, "header layout");

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void seterr(char *err, size_t len, const char *fmt, ...)
{
    if (!err || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* --- records --- */

/* The CRC of a record: the whole slot (header page with its CRC field as
 * zero, payload, padding), so that no byte of a slot can change unseen.
 * hdr is the slot's first pay_off bytes; payload the slot_bytes - pay_off
 * after them (elsewhere in memory when the I/O is direct: no padding then). */
static uint32_t header_crc(const tier_disk_t *td, const uint8_t *hdr)
{
    static const uint8_t zero[4];
    uint32_t c = crc32c(0, hdr, H_CRC);
    c = crc32c(c, zero, sizeof(zero));
    return crc32c(c, hdr + H_CRC + 4, td->pay_off - (H_CRC + 4));
}

static uint32_t record_crc(const tier_disk_t *td, const uint8_t *hdr, const uint8_t *payload)
{
    return crc32c(header_crc(td, hdr), payload, td->slot_bytes - td->pay_off);
}

/* The header page (pay_off bytes at buf) of a record, all but its CRC. */
static void fill_header(const tier_disk_t *td, uint8_t *buf, uint32_t slot,
                        const tier_disk_meta_t *meta)
{
    memset(buf, 0, td->pay_off);
    put32(buf + H_MAGIC, REC_MAGIC);
    put32(buf + H_FORMAT, TIER_DISK_FORMAT);
    put64(buf + H_SEQ, meta->seq);
    put64(buf + H_HASH, meta->chain_hash);
    put64(buf + H_PARENT, meta->parent_hash);
    put32(buf + H_NSID, meta->ns_id);
    uint32_t nt = meta->ntokens <= td->block_tokens ? meta->ntokens : td->block_tokens;
    put32(buf + H_NTOK, nt);
    put32(buf + H_LEN, (uint32_t)td->block_bytes);
    put32(buf + H_SLOT, slot);
    size_t nl = strnlen(meta->ns, TIER_DISK_NS_MAX - 1);
    memcpy(buf + H_NS, meta->ns, nl);
    for (uint32_t i = 0; i < nt; i++)
        put32(buf + H_TOKENS + 4 * i, meta->tokens[i]);
}

/* The header page (pay_off bytes at buf) of a record whose payload (and
 * padding) is at payload. */
static void encode_header(const tier_disk_t *td, uint8_t *buf, const uint8_t *payload,
                          uint32_t slot, const tier_disk_meta_t *meta)
{
    fill_header(td, buf, slot, meta);
    put32(buf + H_CRC, record_crc(td, buf, payload));
}

/* The record around a block already at buf + pay_off whose CRC32C is
 * block_crc (crc32c(0, block, block_bytes), taken as it was copied there):
 * the padding is zeroed and checksummed, the header's CRC joined to the
 * block's, so that the block is not read again. */
static void encode_around(const tier_disk_t *td, uint8_t *buf, uint32_t slot,
                          const tier_disk_meta_t *meta, uint32_t block_crc)
{
    size_t end = td->pay_off + td->block_bytes, pad = td->slot_bytes - end;
    memset(buf + end, 0, pad);
    fill_header(td, buf, slot, meta);
    uint32_t payload_crc = crc32c(block_crc, buf + end, pad);
    put32(buf + H_CRC,
          crc32c_combine(header_crc(td, buf), payload_crc, td->slot_bytes - td->pay_off));
}

void tier_disk_encode(const tier_disk_t *td, uint8_t *buf, uint32_t slot,
                      const tier_disk_meta_t *meta, const void *payload)
{
    uint32_t c = crc32c_copy(0, buf + td->pay_off, payload, td->block_bytes);
    encode_around(td, buf, slot, meta, c);
}

/* tier_disk_decode of a record whose header page is at hdr and payload at
 * payload. */
static int decode_parts(const tier_disk_t *td, const uint8_t *buf, const uint8_t *payload,
                        uint32_t slot, tier_disk_meta_t *meta, uint32_t *tokens, bool *blank)
{
    *blank = get32(buf + H_MAGIC) == 0 && get64(buf + H_SEQ) == 0;
    if (*blank)
        return KVS_ENOTFOUND;
    uint32_t nt = get32(buf + H_NTOK);
    if (get32(buf + H_MAGIC) != REC_MAGIC || get32(buf + H_FORMAT) != TIER_DISK_FORMAT ||
        get32(buf + H_SLOT) != slot || get32(buf + H_LEN) != td->block_bytes ||
        nt > td->block_tokens || memchr(buf + H_NS, 0, TIER_DISK_NS_MAX) == NULL)
        return KVS_ENOTFOUND;
    if (record_crc(td, buf, payload) != get32(buf + H_CRC))
        return KVS_ENOTFOUND;
    meta->seq = get64(buf + H_SEQ);
    meta->chain_hash = get64(buf + H_HASH);
    meta->parent_hash = get64(buf + H_PARENT);
    meta->ns_id = get32(buf + H_NSID);
    meta->ntokens = nt;
    memcpy(meta->ns, buf + H_NS, TIER_DISK_NS_MAX);
    for (uint32_t i = 0; i < nt && tokens; i++)
        tokens[i] = get32(buf + H_TOKENS + 4 * i);
    meta->tokens = tokens;
    return 0;
}

int tier_disk_decode(const tier_disk_t *td, const uint8_t *buf, uint32_t slot,
                     tier_disk_meta_t *meta, uint32_t *tokens, bool *blank)
{
    return decode_parts(td, buf, buf + td->pay_off, slot, meta, tokens, blank);
}

/* --- engine callbacks --- */

bool td_direct(const tier_disk_t *td, const td_batch_t *b, size_t i)
{
    const tier_disk_op_t *op = &b->ops[i];
    return td->direct_ok && op->data && !(b->write && op->fill) &&
           (uintptr_t)op->data % TIER_DISK_ALIGN == 0;
}

void td_prepare(tier_disk_t *td, td_batch_t *b, size_t i, uint8_t *buf)
{
    tier_disk_op_t *op = &b->ops[i];
    if (b->write && op->fill) {
        uint32_t c = op->fill(op->fill_ctx, op->fill_src, buf + td->pay_off);
        encode_around(td, buf, op->slot, &op->meta, c);
    } else if (b->write && td_direct(td, b, i)) {
        encode_header(td, buf, op->data, op->slot, &op->meta); /* only the CRC reads the payload */
    } else if (b->write) {
        tier_disk_encode(td, buf, op->slot, &op->meta, op->data);
    }
}

/* A read's check: the record verifies and is the block asked for. A direct
 * read's payload is in op->data already; otherwise it is copied there, or
 * (no data: drained from buf) left in buf. */
static int check_read(tier_disk_t *td, tier_disk_op_t *op, const uint8_t *buf, bool direct)
{
    tier_disk_meta_t got;
    bool blank;
    const uint8_t *payload = direct ? op->data : buf + td->pay_off;
    if (decode_parts(td, buf, payload, op->slot, &got, NULL, &blank) != 0) {
        if (!blank)
            atomic_fetch_add(&td->crc_failures, 1);
        else
            atomic_fetch_add(&td->mismatches, 1);
        return KVS_ENOTFOUND;
    }
    if (got.chain_hash != op->meta.chain_hash || got.ns_id != op->meta.ns_id ||
        (op->meta.seq != 0 && got.seq != op->meta.seq)) {
        atomic_fetch_add(&td->mismatches, 1);
        return KVS_ENOTFOUND;
    }
    if (!direct && op->data)
        memcpy(op->data, buf + td->pay_off, td->block_bytes);
    return 0;
}

void td_finish(tier_disk_t *td, td_batch_t *b, size_t i, uint8_t *buf, long res)
{
    tier_disk_op_t *op = &b->ops[i];
    if (res != (long)td->slot_bytes) {
        atomic_fetch_add(&td->io_errors, 1);
        op->status = KVS_EIO;
    } else if (b->write) {
        atomic_fetch_add(&td->writes, 1);
        atomic_fetch_add(&td->write_bytes, td->block_bytes);
        op->status = 0;
    } else {
        op->status = check_read(td, op, buf, td_direct(td, b, i));
        if (op->status == 0 && op->drain &&
            op->drain(op->drain_ctx, op->drain_dst, op->data ? op->data : buf + td->pay_off) != 0) {
            atomic_fetch_add(&td->io_errors, 1);
            op->status = KVS_EIO;
        }
        if (op->status == 0) {
            atomic_fetch_add(&td->reads, 1);
            atomic_fetch_add(&td->read_bytes, td->block_bytes);
        }
    }
    if (atomic_fetch_sub(&b->left, 1) == 1) {
        b->done(b->arg, b->ops, b->n);
        free(b);
    }
}

int tier_disk_submit(tier_disk_t *td, bool write, tier_disk_op_t *ops, size_t n,
                     tier_disk_done_fn done, void *arg)
{
    if (n == 0)
        return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (ops[i].slot >= td->nslots ||
            (!ops[i].data && !(write ? ops[i].fill != NULL : ops[i].drain != NULL)))
            return KVS_EINVAL;
    td_batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVS_ENOMEM;
    b->td = td;
    b->write = write;
    b->ops = ops;
    b->n = n;
    atomic_init(&b->left, n);
    b->done = done;
    b->arg = arg;
    for (size_t i = 0; i < n; i++) {
        ops[i].status = KVS_EIO;
        if (write)
            ops[i].meta.seq = atomic_fetch_add(&td->next_seq, 1);
    }
    td_engine_push(td, b);
    return 0;
}

/* --- slots --- */

static void lru_unlink(tier_disk_t *td, uint32_t s)
{
    uint32_t p = td->prev[s], n = td->next[s];
    if (p != TIER_DISK_NO_SLOT)
        td->next[p] = n;
    else
        td->head = n;
    if (n != TIER_DISK_NO_SLOT)
        td->prev[n] = p;
    else
        td->tail = p;
}

static void lru_push_head(tier_disk_t *td, uint32_t s)
{
    td->prev[s] = TIER_DISK_NO_SLOT;
    td->next[s] = td->head;
    if (td->head != TIER_DISK_NO_SLOT)
        td->prev[td->head] = s;
    td->head = s;
    if (td->tail == TIER_DISK_NO_SLOT)
        td->tail = s;
}

/* Marks a free slot used and most recent: out of the free stack (its place
 * taken by the top entry). */
static void slot_take(tier_disk_t *td, uint32_t s)
{
    uint32_t at = td->free_pos[s], top = td->free_stack[--td->nfree];
    td->free_stack[at] = top;
    td->free_pos[top] = at;
    td->free_pos[s] = TIER_DISK_NO_SLOT;
    td->used[s] = 1;
    td->nused++;
    lru_push_head(td, s);
}

uint32_t tier_disk_slot_alloc(tier_disk_t *td, bool *evicted)
{
    *evicted = false;
    if (td->nfree > 0) {
        uint32_t s = td->free_stack[td->nfree - 1];
        slot_take(td, s);
        return s;
    }
    uint32_t s = td->tail;
    if (s == TIER_DISK_NO_SLOT)
        return TIER_DISK_NO_SLOT;
    lru_unlink(td, s);
    lru_push_head(td, s);
    td->evictions++;
    *evicted = true;
    return s;
}

void tier_disk_slot_claim(tier_disk_t *td, uint32_t s)
{
    if (s >= td->nslots || td->used[s])
        return;
    slot_take(td, s);
}

void tier_disk_slot_touch(tier_disk_t *td, uint32_t s)
{
    if (s >= td->nslots || !td->used[s])
        return;
    lru_unlink(td, s);
    lru_push_head(td, s);
}

void tier_disk_slot_free(tier_disk_t *td, uint32_t s)
{
    if (s >= td->nslots || !td->used[s])
        return;
    lru_unlink(td, s);
    td->used[s] = 0;
    td->nused--;
    td->free_pos[s] = td->nfree;
    td->free_stack[td->nfree++] = s;
}

bool tier_disk_slot_used(const tier_disk_t *td, uint32_t s)
{
    return s < td->nslots && td->used[s];
}

/* --- scan --- */

static int cmp_key(const void *a, const void *b)
{
    const tier_disk_record_t *x = a, *y = b;
    int c = strcmp(x->ns, y->ns);
    if (c != 0)
        return c;
    if (x->chain_hash != y->chain_hash)
        return x->chain_hash < y->chain_hash ? -1 : 1;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0; /* newest first */
}

static int cmp_seq(const void *a, const void *b)
{
    const tier_disk_record_t *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void tier_disk_scan_free(tier_disk_scan_t *s)
{
    for (size_t i = 0; s && i < s->n; i++)
        free(s->recs[i].tokens);
    if (s) {
        free(s->recs);
        memset(s, 0, sizeof(*s));
    }
}

/* Adds the record in buf (slot) to the scan if it verifies. */
static int scan_one(tier_disk_t *td, const uint8_t *buf, uint32_t slot, size_t *cap)
{
    tier_disk_scan_t *sc = &td->scan;
    uint32_t *tokens = malloc((size_t)td->block_tokens * sizeof(uint32_t) + 1);
    if (!tokens)
        return KVS_ENOMEM;
    tier_disk_meta_t m;
    bool blank;
    if (tier_disk_decode(td, buf, slot, &m, tokens, &blank) != 0) {
        free(tokens);
        if (!blank)
            sc->torn++;
        return 0;
    }
    if (sc->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        tier_disk_record_t *r = realloc(sc->recs, nc * sizeof(*r));
        if (!r) {
            free(tokens);
            return KVS_ENOMEM;
        }
        sc->recs = r;
        *cap = nc;
    }
    tier_disk_record_t *r = &sc->recs[sc->n++];
    *r = (tier_disk_record_t){.slot = slot,
                              .seq = m.seq,
                              .ns_id = m.ns_id,
                              .chain_hash = m.chain_hash,
                              .parent_hash = m.parent_hash,
                              .ntokens = m.ntokens,
                              .tokens = tokens};
    memcpy(r->ns, m.ns, TIER_DISK_NS_MAX);
    return 0;
}

/* Reads every slot in runs of whole slots, keeps the newest record of each
 * block, and marks their slots used oldest first. */
static int scan_file(tier_disk_t *td, char *err, size_t errlen)
{
    uint32_t run = (uint32_t)((4u << 20) / td->slot_bytes);
    if (run == 0)
        run = 1;
    uint8_t *buf = tier_disk_buffer_alloc((size_t)run * td->slot_bytes);
    if (!buf)
        return KVS_ENOMEM;
    size_t cap = 0;
    int rc = 0;
    uint64_t max_seq = 0;
    for (uint32_t s = 0; s < td->nslots && rc == 0; s += run) {
        uint32_t k = td->nslots - s < run ? td->nslots - s : run;
        size_t want = (size_t)k * td->slot_bytes;
        ssize_t got = pread(td->fd, buf, want, (off_t)td_slot_offset(td, s));
        if (got != (ssize_t)want) {
            seterr(err, errlen, "disk_tier_path: reading the file at start failed: %s",
                   got < 0 ? strerror(errno) : "short read");
            rc = KVS_EIO;
            break;
        }
        for (uint32_t j = 0; j < k && rc == 0; j++)
            rc = scan_one(td, buf + (size_t)j * td->slot_bytes, s + j, &cap);
    }
    free(buf);
    tier_disk_scan_t *sc = &td->scan;
    td->torn = sc->torn;
    if (rc != 0 || sc->n == 0) /* qsort takes no NULL array, even empty */
        return rc;
    /* The newest record of each block wins. */
    qsort(sc->recs, sc->n, sizeof(*sc->recs), cmp_key);
    size_t w = 0;
    for (size_t i = 0; i < sc->n; i++) {
        if (w > 0 && strcmp(sc->recs[w - 1].ns, sc->recs[i].ns) == 0 &&
            sc->recs[w - 1].chain_hash == sc->recs[i].chain_hash) {
            free(sc->recs[i].tokens);
            sc->stale++;
            continue;
        }
        sc->recs[w++] = sc->recs[i];
    }
    sc->n = w;
    qsort(sc->recs, sc->n, sizeof(*sc->recs), cmp_seq);
    for (size_t i = 0; i < sc->n; i++) {
        slot_take(td, sc->recs[i].slot);
        if (sc->recs[i].seq > max_seq)
            max_seq = sc->recs[i].seq;
    }
    atomic_store(&td->next_seq, max_seq + 1);
    td->recovered = sc->n;
    return 0;
}

void tier_disk_take_scan(tier_disk_t *td, tier_disk_scan_t *out)
{
    *out = td->scan;
    memset(&td->scan, 0, sizeof(td->scan));
}

/* --- open / close --- */

static void encode_sb(const tier_disk_t *td, uint8_t *sb)
{
    memset(sb, 0, TIER_DISK_ALIGN);
    put64(sb + S_MAGIC, SB_MAGIC);
    put32(sb + S_FORMAT, TIER_DISK_FORMAT);
    put32(sb + S_TOKENS, td->block_tokens);
    put64(sb + S_BLOCK, td->block_bytes);
    put64(sb + S_GEO, td->geometry_id);
    put64(sb + S_SLOT, td->slot_bytes);
    put64(sb + S_NSLOTS, td->nslots);
    put32(sb + S_CRC, crc32c(0, sb, S_CRC));
}

/* Why the superblock in sb does not fit td, or NULL when it does. */
static const char *sb_mismatch(const tier_disk_t *td, const uint8_t *sb)
{
    if (get64(sb + S_MAGIC) != SB_MAGIC || get32(sb + S_CRC) != crc32c(0, sb, S_CRC))
        return "it is not a kvshare disk tier file (or its superblock is damaged)";
    if (get32(sb + S_FORMAT) != TIER_DISK_FORMAT)
        return "it was written in another format version";
    if (get32(sb + S_TOKENS) != td->block_tokens || get64(sb + S_BLOCK) != td->block_bytes ||
        get64(sb + S_GEO) != td->geometry_id || get64(sb + S_SLOT) != td->slot_bytes)
        return "it was written for another block geometry";
    if (get64(sb + S_NSLOTS) != td->nslots)
        return "it was written with another disk_tier_bytes";
    return NULL;
}

/* Sizes the file to file_bytes with fallocate (zeroes: blank slots) and
 * writes the superblock. */
static int format_file(tier_disk_t *td, uint8_t *sb, const char *path, char *err, size_t errlen)
{
    if (ftruncate(td->fd, 0) != 0 || fallocate(td->fd, 0, 0, (off_t)td->file_bytes) != 0) {
        int e = errno;
        seterr(err, errlen, "disk_tier_bytes: cannot preallocate %llu bytes for %s: %s",
               (unsigned long long)td->file_bytes, path, strerror(e));
        return e == EOPNOTSUPP ? KVS_ENOTSUP : KVS_EIO;
    }
    encode_sb(td, sb);
    if (pwrite(td->fd, sb, TIER_DISK_ALIGN, 0) != (ssize_t)TIER_DISK_ALIGN || fsync(td->fd) != 0) {
        seterr(err, errlen, "disk_tier_path: writing %s failed: %s", path, strerror(errno));
        return KVS_EIO;
    }
    return 0;
}

static int open_fd(const tier_disk_config_t *cfg, bool *created, char *err, size_t errlen)
{
    int fd = open(cfg->path, O_RDWR | O_DIRECT | O_CLOEXEC);
    *created = false;
    if (fd < 0 && errno == ENOENT) {
        fd = open(cfg->path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
        *created = fd >= 0;
    }
    if (fd >= 0) {
        /* Two daemons writing one file would tear each other's slots. A
         * daemon killed a moment ago may still hold the lock: the kernel
         * closes its file after its io_uring's last I/O, asynchronously. */
        int e = 0;
        for (int tries = 0; tries < 200; tries++) {
            if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                return fd;
            e = errno;
            if (e != EWOULDBLOCK)
                break;
            usleep(10 * 1000);
        }
        seterr(err, errlen, "disk_tier_path: %s is in use by another process%s", cfg->path,
               e == EWOULDBLOCK ? "" : " (it cannot be locked)");
        close(fd);
        *created = false; /* whoever holds it keeps it */
        return -1;
    }
    int e = errno;
    if (e == ENOENT)
        seterr(err, errlen, "disk_tier_path: the directory of %s does not exist", cfg->path);
    else if (e == EINVAL)
        seterr(err, errlen, "disk_tier_path: %s is on a file system without O_DIRECT", cfg->path);
    else if (e == EACCES || e == EROFS || e == EPERM)
        seterr(err, errlen, "disk_tier_path: %s cannot be opened for writing: %s", cfg->path,
               strerror(e));
    else
        seterr(err, errlen, "disk_tier_path: cannot open %s: %s", cfg->path, strerror(e));
    return -1;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static int geometry(tier_disk_t *td, const tier_disk_config_t *cfg, char *err, size_t errlen)
{
    if (!cfg->path || !*cfg->path || cfg->block_bytes == 0 || cfg->block_tokens == 0 ||
        cfg->block_bytes > UINT32_MAX) {
        seterr(err, errlen, "disk tier: a path, a block size and block tokens are needed");
        return KVS_EINVAL;
    }
    td->block_bytes = cfg->block_bytes;
    td->block_tokens = cfg->block_tokens;
    td->geometry_id = cfg->geometry_id;
    td->hdr_bytes = TIER_DISK_HDR_FIXED + 4ull * cfg->block_tokens;
    /* A block of whole pages starts on a page, after the header's own
     * page(s): in page-aligned memory it goes to and from the disk in place,
     * and the slot is no larger than header and block packed. A smaller
     * block follows its header (no in-place I/O, no page wasted). */
    td->direct_ok = td->block_bytes % TIER_DISK_ALIGN == 0;
    td->pay_off = td->direct_ok ? round_up(td->hdr_bytes, TIER_DISK_ALIGN) : td->hdr_bytes;
    td->slot_bytes = round_up(td->pay_off + td->block_bytes, TIER_DISK_ALIGN);
    uint64_t n = cfg->bytes > TIER_DISK_ALIGN ? (cfg->bytes - TIER_DISK_ALIGN) / td->slot_bytes : 0;
    if (n == 0 || n >= UINT32_MAX) {
        seterr(err, errlen,
               "disk_tier_bytes: %llu bytes %s (a slot takes %llu bytes, the superblock %u)",
               (unsigned long long)cfg->bytes, n == 0 ? "is too small" : "is too large",
               (unsigned long long)td->slot_bytes, TIER_DISK_ALIGN);
        return KVS_EINVAL;
    }
    td->nslots = (uint32_t)n;
    td->file_bytes = TIER_DISK_ALIGN + n * td->slot_bytes;
    return 0;
}

static int alloc_slots(tier_disk_t *td)
{
    size_t n = td->nslots;
    td->prev = malloc(n * sizeof(uint32_t));
    td->next = malloc(n * sizeof(uint32_t));
    td->free_stack = malloc(n * sizeof(uint32_t));
    td->free_pos = malloc(n * sizeof(uint32_t));
    td->used = calloc(n, 1);
    if (!td->prev || !td->next || !td->free_stack || !td->free_pos || !td->used)
        return KVS_ENOMEM;
    td->head = td->tail = TIER_DISK_NO_SLOT;
    /* Lowest slots first off the stack. */
    for (size_t i = 0; i < n; i++) {
        td->free_stack[i] = (uint32_t)(n - 1 - i);
        td->free_pos[n - 1 - i] = (uint32_t)i;
    }
    td->nfree = (uint32_t)n;
    return 0;
}

/* The superblock: a new file is formatted, an existing one checked (and
 * scanned), or wiped when it does not fit and cfg->wipe. */
static int attach_file(tier_disk_t *td, const tier_disk_config_t *cfg, bool created, char *err,
                       size_t errlen)
{
    uint8_t *sb;
    if (posix_memalign((void **)&sb, TIER_DISK_ALIGN, TIER_DISK_ALIGN) != 0)
        return KVS_ENOMEM;
    int rc = 0;
    struct stat st;
    if (fstat(td->fd, &st) != 0 || created || st.st_size == 0) {
        rc = format_file(td, sb, cfg->path, err, errlen);
    } else {
        ssize_t got = pread(td->fd, sb, TIER_DISK_ALIGN, 0);
        const char *why = got == (ssize_t)TIER_DISK_ALIGN ? sb_mismatch(td, sb)
                                                          : "it is shorter than a superblock";
        if (!why && (uint64_t)st.st_size < td->file_bytes)
            why = "it is shorter than its superblock says";
        if (why && cfg->wipe) {
            LOG_WARN("disk tier: %s: %s; wiping it (disk_tier_wipe)", cfg->path, why);
            rc = format_file(td, sb, cfg->path, err, errlen);
        } else if (why) {
            seterr(err, errlen, "disk_tier_path: %s is refused: %s (disk_tier_wipe starts it over)",
                   cfg->path, why);
            rc = KVS_EINVAL;
        } else {
            rc = scan_file(td, err, errlen);
        }
    }
    free(sb);
    return rc;
}

int tier_disk_open(const tier_disk_config_t *cfg, tier_disk_t **out, char *err, size_t errlen)
{
    tier_disk_t *td = calloc(1, sizeof(*td));
    if (!td)
        return KVS_ENOMEM;
    td->fd = -1;
    atomic_init(&td->next_seq, 1);
    int rc = geometry(td, cfg, err, errlen);
    bool created = false;
    if (rc == 0) {
        td->fd = open_fd(cfg, &created, err, errlen);
        if (td->fd < 0)
            rc = KVS_EINVAL;
    }
    if (rc == 0 && (rc = alloc_slots(td)) != 0)
        seterr(err, errlen, "disk tier: out of memory for %u slots", td->nslots);
    if (rc == 0)
        rc = attach_file(td, cfg, created, err, errlen);
    uint32_t qd = cfg->queue_depth ? cfg->queue_depth : 64;
    if (rc == 0 && qd < 32) {
        seterr(err, errlen, "disk tier: queue depth %u is under 32", qd);
        rc = KVS_EINVAL;
    }
    if (rc == 0)
        rc = td_engine_start(td, cfg->io, qd, err, errlen);
    if (rc != 0) {
        if (created)
            unlink(cfg->path);
        tier_disk_close(td);
        return rc;
    }
    LOG_INFO("disk tier: %s, %u slots of %llu bytes, I/O on %s, %llu blocks recovered, %llu "
             "torn slots skipped",
             cfg->path, td->nslots, (unsigned long long)td->slot_bytes, td->io_name,
             (unsigned long long)td->recovered, (unsigned long long)td->torn);
    *out = td;
    return 0;
}

void tier_disk_close(tier_disk_t *td)
{
    if (!td)
        return;
    if (td->eng)
        td_engine_stop(td);
    if (td->fd >= 0)
        close(td->fd);
    tier_disk_scan_free(&td->scan);
    free(td->prev);
    free(td->next);
    free(td->free_stack);
    free(td->free_pos);
    free(td->used);
    free(td);
}

uint32_t tier_disk_capacity(const tier_disk_t *td)
{
    return td->nslots;
}

#define HUGE_PAGE (2u << 20)

void *tier_disk_buffer_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE) {
        void *p = NULL;
        return posix_memalign(&p, TIER_DISK_ALIGN, bytes) == 0 ? p : NULL;
    }
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, len) != 0)
        return NULL;
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: EINVAL where THP is not built in */
    return p;
}

uint64_t tier_disk_slot_bytes(const tier_disk_t *td)
{
    return td->slot_bytes;
}

const char *tier_disk_io_name(const tier_disk_t *td)
{
    return td->io_name;
}

void tier_disk_stats(const tier_disk_t *td, tier_disk_stats_t *out)
{
    tier_disk_t *t = (tier_disk_t *)td; /* atomics are read, never written */
    *out = (tier_disk_stats_t){
        .io = td->io_name,
        .slots = td->nslots,
        .used = td->nused,
        .reads = atomic_load(&t->reads),
        .writes = atomic_load(&t->writes),
        .read_bytes = atomic_load(&t->read_bytes),
        .write_bytes = atomic_load(&t->write_bytes),
        .io_errors = atomic_load(&t->io_errors),
        .crc_failures = atomic_load(&t->crc_failures),
        .mismatches = atomic_load(&t->mismatches),
        .evictions = td->evictions,
        .recovered = td->recovered,
        .torn = td->torn,
    };
}
