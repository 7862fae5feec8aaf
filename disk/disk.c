/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The disk tier's file (disk.h): superblock, record encoding and
 * checking, the slot allocator and its LRU, and the scan that a warm restart
 * rebuilds from. The I/O engines are in disk_io.c.
 */
#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "crc32c.h"
#include "kvshare_status.h"
#include "disk_impl.h"

#define SB_MAGIC   0x3352454954535653ull /* "SVSTIER3" little endian */
#define REC_MAGIC  0x5253564Bu           /* "KVSR" */
#define TOMB_MAGIC 0x4453564Bu           /* "KVSD": a deleted record (disk_forget) */
#define TAB_MAGIC  0x4E53564Bu           /* "KVSN": the namespace table */

/* Record header offsets (DISK_HDR_FIXED bytes, then the tokens). */
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
    H_TOKENS = DISK_HDR_FIXED,
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

/* Namespace table offsets, in the superblock page after the superblock
 * (whose CRC covers bytes 0-47 only). Then the body: the identity texts
 * (each: u64 hash, u16 length, the text), then the entries (each: u8 name
 * length, the name, u8 source, u8 text index, u64 watermark). */
enum {
    T_MAGIC = 64,
    T_CRC = 68, /* CRC32C of [T_LEN, T_BODY + length) */
    T_LEN = 72, /* body bytes */
    T_NTEXT = 76,
    T_NENT = 78,
    T_BODY = 80,
};

_Static_assert(H_NS + DISK_NS_MAX == DISK_HDR_FIXED, "header layout");

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

/* --- notes --- */

void disk__note(disk_t *d, disk_note_level_t level, const char *fmt, ...)
{
    pthread_mutex_lock(&d->notes_mu);
    if (d->notes_n == DISK_NOTES_MAX) {
        d->notes_dropped++;
    } else {
        va_list ap;
        va_start(ap, fmt);
        d->notes[d->notes_n].level = level;
        vsnprintf(d->notes[d->notes_n].text, DISK_NOTE_MAX, fmt, ap);
        va_end(ap);
        d->notes_n++;
    }
    pthread_mutex_unlock(&d->notes_mu);
}

/* The queue is taken whole under the lock and handed over outside it: a
 * note function that takes its time holds up no disk thread. */
void disk_notes_flush(disk_t *d)
{
    struct {
        disk_note_level_t level;
        char text[DISK_NOTE_MAX];
    } taken[DISK_NOTES_MAX]; /* 8 KiB */
    pthread_mutex_lock(&d->notes_mu);
    uint32_t n = d->notes_n;
    uint64_t dropped = d->notes_dropped;
    memcpy(taken, d->notes, n * sizeof(taken[0]));
    d->notes_n = 0;
    d->notes_dropped = 0;
    pthread_mutex_unlock(&d->notes_mu);
    if (!d->note)
        return;
    for (uint32_t i = 0; i < n; i++)
        d->note(d->note_arg, taken[i].level, taken[i].text);
    if (dropped > 0) {
        char text[96];
        snprintf(text, sizeof(text), "%llu more notes were not kept (%u were waiting)",
                 (unsigned long long)dropped, DISK_NOTES_MAX);
        d->note(d->note_arg, DISK_NOTE_WARN, text);
    }
}

/* --- records --- */

/* The CRC of a record: the whole slot (header page with its CRC field as
 * zero, payload, padding), so that no byte of a slot can change unseen.
 * hdr is the slot's first pay_off bytes; payload the slot_bytes - pay_off
 * after them (elsewhere in memory when the I/O is direct: no padding then). */
static uint32_t header_crc(const disk_t *d, const uint8_t *hdr)
{
    static const uint8_t zero[4];
    uint32_t c = crc32c(0, hdr, H_CRC);
    c = crc32c(c, zero, sizeof(zero));
    return crc32c(c, hdr + H_CRC + 4, d->pay_off - (H_CRC + 4));
}

static uint32_t record_crc(const disk_t *d, const uint8_t *hdr, const uint8_t *payload)
{
    return crc32c(header_crc(d, hdr), payload, d->slot_bytes - d->pay_off);
}

/* The header page (pay_off bytes at buf) of a record, all but its CRC. */
static void fill_header(const disk_t *d, uint8_t *buf, uint32_t slot, const disk_meta_t *meta)
{
    memset(buf, 0, d->pay_off);
    put32(buf + H_MAGIC, REC_MAGIC);
    put32(buf + H_FORMAT, DISK_FORMAT);
    put64(buf + H_SEQ, meta->seq);
    put64(buf + H_HASH, meta->chain_hash);
    put64(buf + H_PARENT, meta->parent_hash);
    put32(buf + H_NSID, meta->ns_id);
    uint32_t nt = meta->ntokens <= d->block_tokens ? meta->ntokens : d->block_tokens;
    put32(buf + H_NTOK, nt);
    put32(buf + H_LEN, (uint32_t)d->block_bytes);
    put32(buf + H_SLOT, slot);
    size_t nl = strnlen(meta->ns, DISK_NS_MAX - 1);
    memcpy(buf + H_NS, meta->ns, nl);
    for (uint32_t i = 0; i < nt; i++)
        put32(buf + H_TOKENS + 4 * i, meta->tokens[i]);
    put64(buf + d->ident_off, meta->ident_hash);
}

/* The header page (pay_off bytes at buf) of a record whose payload (and
 * padding) is at payload. */
static void encode_header(const disk_t *d, uint8_t *buf, const uint8_t *payload, uint32_t slot,
                          const disk_meta_t *meta)
{
    fill_header(d, buf, slot, meta);
    put32(buf + H_CRC, record_crc(d, buf, payload));
}

/* The record around a block already at buf + pay_off whose CRC32C is
 * block_crc (crc32c(0, block, block_bytes), taken as it was copied there):
 * the padding is zeroed and checksummed, the header's CRC joined to the
 * block's, so that the block is not read again. */
static void encode_around(const disk_t *d, uint8_t *buf, uint32_t slot, const disk_meta_t *meta,
                          uint32_t block_crc)
{
    size_t end = d->pay_off + d->block_bytes, pad = d->slot_bytes - end;
    memset(buf + end, 0, pad);
    fill_header(d, buf, slot, meta);
    uint32_t payload_crc = crc32c_combine_shift(block_crc, d->pad_crc, d->pad_shift);
    put32(buf + H_CRC, crc32c_combine_shift(header_crc(d, buf), payload_crc, d->body_shift));
}

void disk_encode(const disk_t *d, uint8_t *buf, uint32_t slot, const disk_meta_t *meta,
                 const void *payload)
{
    uint32_t c = crc32c_copy(0, buf + d->pay_off, payload, d->block_bytes);
    encode_around(d, buf, slot, meta, c);
}

/* disk_decode of a record whose header page is at hdr and payload at
 * payload. */
static int decode_parts(const disk_t *d, const uint8_t *buf, const uint8_t *payload, uint32_t slot,
                        disk_meta_t *meta, uint32_t *tokens, bool *blank)
{
    *blank = get32(buf + H_MAGIC) == 0 && get64(buf + H_SEQ) == 0;
    if (*blank)
        return KVS_ENOTFOUND;
    uint32_t nt = get32(buf + H_NTOK);
    if (get32(buf + H_MAGIC) != REC_MAGIC || get32(buf + H_FORMAT) != DISK_FORMAT ||
        get32(buf + H_SLOT) != slot || get32(buf + H_LEN) != d->block_bytes ||
        nt > d->block_tokens || memchr(buf + H_NS, 0, DISK_NS_MAX) == NULL)
        return KVS_ENOTFOUND;
    if (record_crc(d, buf, payload) != get32(buf + H_CRC))
        return KVS_ENOTFOUND;
    meta->seq = get64(buf + H_SEQ);
    meta->chain_hash = get64(buf + H_HASH);
    meta->parent_hash = get64(buf + H_PARENT);
    meta->ns_id = get32(buf + H_NSID);
    meta->ntokens = nt;
    meta->ident_hash = get64(buf + d->ident_off);
    memcpy(meta->ns, buf + H_NS, DISK_NS_MAX);
    for (uint32_t i = 0; i < nt && tokens; i++)
        tokens[i] = get32(buf + H_TOKENS + 4 * i);
    meta->tokens = tokens;
    return 0;
}

int disk_decode(const disk_t *d, const uint8_t *buf, uint32_t slot, disk_meta_t *meta,
                uint32_t *tokens, bool *blank)
{
    return decode_parts(d, buf, buf + d->pay_off, slot, meta, tokens, blank);
}

/* --- engine callbacks --- */

bool disk__direct(const disk_t *d, const disk__batch_t *b, size_t i)
{
    const disk_op_t *op = &b->ops[i];
    return d->direct_ok && op->data && !(b->write && op->fill) &&
           (uintptr_t)op->data % DISK_ALIGN == 0;
}

void disk__prepare(disk_t *d, disk__batch_t *b, size_t i, uint8_t *buf)
{
    disk_op_t *op = &b->ops[i];
    if (b->write && op->fill) {
        uint32_t c = op->fill(op->fill_ctx, op->fill_src, buf + d->pay_off);
        encode_around(d, buf, op->slot, &op->meta, c);
    } else if (b->write && disk__direct(d, b, i)) {
        encode_header(d, buf, op->data, op->slot, &op->meta); /* only the CRC reads the payload */
    } else if (b->write) {
        disk_encode(d, buf, op->slot, &op->meta, op->data);
    }
}

/* A read's check: the record verifies and is the block asked for. A direct
 * read's payload is in op->data already; otherwise it is copied there, or
 * (no data: drained from buf) left in buf. */
static int check_read(disk_t *d, disk_op_t *op, const uint8_t *buf, bool direct)
{
    disk_meta_t got;
    bool blank;
    const uint8_t *payload = direct ? op->data : buf + d->pay_off;
    if (decode_parts(d, buf, payload, op->slot, &got, NULL, &blank) != 0) {
        if (!blank)
            atomic_fetch_add(&d->crc_failures, 1);
        else
            atomic_fetch_add(&d->mismatches, 1);
        return KVS_ENOTFOUND;
    }
    if (got.chain_hash != op->meta.chain_hash || got.ns_id != op->meta.ns_id ||
        (op->meta.seq != 0 && got.seq != op->meta.seq)) {
        atomic_fetch_add(&d->mismatches, 1);
        return KVS_ENOTFOUND;
    }
    if (!direct && op->data)
        memcpy(op->data, buf + d->pay_off, d->block_bytes);
    return 0;
}

void disk__finish(disk_t *d, disk__batch_t *b, size_t i, uint8_t *buf, long res)
{
    disk_op_t *op = &b->ops[i];
    if (res != (long)d->slot_bytes) {
        atomic_fetch_add(&d->io_errors, 1);
        op->status = KVS_EIO;
    } else if (b->write) {
        atomic_fetch_add(&d->writes, 1);
        atomic_fetch_add(&d->write_bytes, d->block_bytes);
        op->status = 0;
    } else {
        op->status = check_read(d, op, buf, disk__direct(d, b, i));
        if (op->status == 0 && op->drain &&
            op->drain(op->drain_ctx, op->drain_dst, op->data ? op->data : buf + d->pay_off) != 0) {
            atomic_fetch_add(&d->io_errors, 1);
            op->status = KVS_EIO;
        }
        if (op->status == 0) {
            atomic_fetch_add(&d->reads, 1);
            atomic_fetch_add(&d->read_bytes, d->block_bytes);
        }
    }
    if (atomic_fetch_sub(&b->left, 1) == 1) {
        b->done(b->arg, b->ops, b->n);
        free(b);
    }
}

int disk_submit(disk_t *d, bool write, disk_op_t *ops, size_t n, disk_done_fn done, void *arg)
{
    if (n == 0)
        return KVS_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (ops[i].slot >= d->nslots ||
            (!ops[i].data && !(write ? ops[i].fill != NULL : ops[i].drain != NULL)))
            return KVS_EINVAL;
    disk__batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return KVS_ENOMEM;
    b->d = d;
    b->write = write;
    b->ops = ops;
    b->n = n;
    atomic_init(&b->left, n);
    b->done = done;
    b->arg = arg;
    for (size_t i = 0; i < n; i++) {
        ops[i].status = KVS_EIO;
        if (write)
            ops[i].meta.seq = atomic_fetch_add(&d->next_seq, 1);
    }
    disk__engine_push(d, b);
    return 0;
}

/* --- slots --- */

static void lru_unlink(disk_t *d, uint32_t s)
{
    uint32_t p = d->prev[s], n = d->next[s];
    if (p != DISK_NO_SLOT)
        d->next[p] = n;
    else
        d->head = n;
    if (n != DISK_NO_SLOT)
        d->prev[n] = p;
    else
        d->tail = p;
}

static void lru_push_head(disk_t *d, uint32_t s)
{
    d->prev[s] = DISK_NO_SLOT;
    d->next[s] = d->head;
    if (d->head != DISK_NO_SLOT)
        d->prev[d->head] = s;
    d->head = s;
    if (d->tail == DISK_NO_SLOT)
        d->tail = s;
}

/* Marks a free slot used and most recent: out of the free stack (its place
 * taken by the top entry). */
static void slot_take(disk_t *d, uint32_t s)
{
    uint32_t at = d->free_pos[s], top = d->free_stack[--d->nfree];
    d->free_stack[at] = top;
    d->free_pos[top] = at;
    d->free_pos[s] = DISK_NO_SLOT;
    d->used[s] = 1;
    d->nused++;
    lru_push_head(d, s);
}

uint32_t disk_slot_alloc(disk_t *d, bool *evicted)
{
    *evicted = false;
    if (d->nfree > 0) {
        uint32_t s = d->free_stack[d->nfree - 1];
        slot_take(d, s);
        return s;
    }
    uint32_t s = d->tail;
    if (s == DISK_NO_SLOT)
        return DISK_NO_SLOT;
    lru_unlink(d, s);
    lru_push_head(d, s);
    d->evictions++;
    *evicted = true;
    return s;
}

void disk_slot_claim(disk_t *d, uint32_t s)
{
    if (s >= d->nslots || d->used[s])
        return;
    slot_take(d, s);
}

void disk_slot_touch(disk_t *d, uint32_t s)
{
    if (s >= d->nslots || !d->used[s])
        return;
    lru_unlink(d, s);
    lru_push_head(d, s);
}

void disk_slot_free(disk_t *d, uint32_t s)
{
    if (s >= d->nslots || !d->used[s])
        return;
    lru_unlink(d, s);
    d->used[s] = 0;
    d->nused--;
    d->free_pos[s] = d->nfree;
    d->free_stack[d->nfree++] = s;
}

bool disk_slot_used(const disk_t *d, uint32_t s)
{
    return s < d->nslots && d->used[s];
}

/* --- scan --- */

static int cmp_key(const void *a, const void *b)
{
    const disk_record_t *x = a, *y = b;
    int c = strcmp(x->ns, y->ns);
    if (c != 0)
        return c;
    if (x->chain_hash != y->chain_hash)
        return x->chain_hash < y->chain_hash ? -1 : 1;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0; /* newest first */
}

static int cmp_seq(const void *a, const void *b)
{
    const disk_record_t *x = a, *y = b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void disk_scan_free(disk_scan_t *s)
{
    for (size_t i = 0; s && i < s->n; i++)
        free(s->recs[i].tokens);
    if (s) {
        free(s->recs);
        memset(s, 0, sizeof(*s));
    }
}

static uint32_t ns_find(disk_t *d, const char *ns);
static int write_page(disk_t *d, char *err, size_t errlen);

/* The entry of table tab (n entries) named ns, or DISK_NO_ENTRY; *last
 * caches the one found last (most records repeat it). */
static uint32_t tab_find(const disk_ns_t *tab, uint32_t n, const char *ns, uint32_t *last)
{
    if (*last < n && strcmp(tab[*last].ns, ns) == 0)
        return *last;
    for (uint32_t e = 0; e < n; e++)
        if (strcmp(tab[e].ns, ns) == 0)
            return *last = e;
    return DISK_NO_ENTRY;
}

/* What one scan reads the watermarks from: the live table (a scan at open,
 * on the loop's thread) or the copy taken at open (a deferred scan, on
 * another thread while the loop changes the live one). */
typedef struct scan_ctx {
    const disk_ns_t *tab;
    uint32_t n_tab, last;
    disk_scan_t *sc;
    size_t cap;
} scan_ctx_t;

/* Adds the record in buf (slot) to the scan if it verifies and was not
 * deleted since. */
static int scan_one(disk_t *d, scan_ctx_t *cx, const uint8_t *buf, uint32_t slot)
{
    disk_scan_t *sc = cx->sc;
    size_t *cap = &cx->cap;
    uint64_t *max_seq = &sc->max_seq;
    if (get32(buf + H_MAGIC) == TOMB_MAGIC) {
        sc->deleted++;
        return 0;
    }
    uint32_t *tokens = malloc((size_t)d->block_tokens * sizeof(uint32_t) + 1);
    if (!tokens)
        return KVS_ENOMEM;
    disk_meta_t m;
    bool blank;
    if (disk_decode(d, buf, slot, &m, tokens, &blank) != 0) {
        free(tokens);
        if (!blank)
            sc->torn++;
        return 0;
    }
    if (m.seq > *max_seq)
        *max_seq = m.seq;
    uint32_t entry = tab_find(cx->tab, cx->n_tab, m.ns, &cx->last);
    if (entry != DISK_NO_ENTRY && m.seq < cx->tab[entry].valid_from) {
        free(tokens); /* cleared after it was written */
        sc->deleted++;
        return 0;
    }
    if (sc->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        disk_record_t *r = realloc(sc->recs, nc * sizeof(*r));
        if (!r) {
            free(tokens);
            return KVS_ENOMEM;
        }
        sc->recs = r;
        *cap = nc;
    }
    disk_record_t *r = &sc->recs[sc->n++];
    *r = (disk_record_t){.slot = slot,
                         .seq = m.seq,
                         .ns_id = m.ns_id,
                         .chain_hash = m.chain_hash,
                         .parent_hash = m.parent_hash,
                         .ntokens = m.ntokens,
                         .tokens = tokens,
                         .ident_hash = m.ident_hash,
                         .entry = entry};
    memcpy(r->ns, m.ns, DISK_NS_MAX);
    return 0;
}

/* Reads every slot in runs of whole slots into cx's scan and keeps the
 * newest record of each block, oldest first. Stops early (KVS_EBUSY)
 * when *stop; *progress counts the slots read. Touches nothing of d that
 * the loop changes: a deferred scan runs it on its own thread. */
static int scan_records(disk_t *d, scan_ctx_t *cx, const atomic_bool *stop,
                        atomic_uint_fast64_t *progress, char *err, size_t errlen)
{
    uint32_t run = (uint32_t)((4u << 20) / d->slot_bytes);
    if (run == 0)
        run = 1;
    uint8_t *buf = disk_buffer_alloc((size_t)run * d->slot_bytes);
    if (!buf)
        return KVS_ENOMEM;
    int rc = 0;
    disk_scan_t *sc = cx->sc;
    for (uint32_t s = 0; s < d->nslots && rc == 0; s += run) {
        if (stop && atomic_load(stop)) {
            rc = KVS_EBUSY;
            break;
        }
        uint32_t k = d->nslots - s < run ? d->nslots - s : run;
        size_t want = (size_t)k * d->slot_bytes;
        ssize_t got = pread(d->fd, buf, want, (off_t)disk__slot_offset(d, s));
        if (got != (ssize_t)want) {
            seterr(err, errlen, "disk_tier_path: reading the file at start failed: %s",
                   got < 0 ? strerror(errno) : "short read");
            rc = KVS_EIO;
            break;
        }
        for (uint32_t j = 0; j < k && rc == 0; j++)
            rc = scan_one(d, cx, buf + (size_t)j * d->slot_bytes, s + j);
        if (progress)
            atomic_fetch_add(progress, k);
    }
    free(buf);
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
    return 0;
}

/* After a scan that found sequence numbers up to max_seq: numbering goes
 * on above every record found, deleted ones too, and never below a
 * watermark, so what is written from now on is alive. A watermark set
 * while a deferred scan ran (DISK_SEQ_ALL: every record then on the
 * disk) becomes that next number, and the page is written again (a
 * failed write is a note: no call returns it). */
static void settle_watermarks(disk_t *d, uint64_t max_seq)
{
    bool all = false;
    for (uint32_t e = 0; e < d->ns_count; e++) {
        if (d->ns_tab[e].valid_from == DISK_SEQ_ALL)
            all = true;
        else if (d->ns_tab[e].valid_from > max_seq)
            max_seq = d->ns_tab[e].valid_from;
    }
    atomic_store(&d->next_seq, max_seq + 1);
    if (!all)
        return;
    for (uint32_t e = 0; e < d->ns_count; e++)
        if (d->ns_tab[e].valid_from == DISK_SEQ_ALL)
            d->ns_tab[e].valid_from = max_seq + 1;
    char err[DISK_NOTE_MAX];
    if (write_page(d, err, sizeof(err)) != 0)
        disk__note(d, DISK_NOTE_ERROR, "%s", err);
}

/* The scan at open: every record, their slots used oldest first. */
static int scan_file(disk_t *d, char *err, size_t errlen)
{
    scan_ctx_t cx = {.tab = d->ns_tab, .n_tab = d->ns_count, .last = 0, .sc = &d->scan};
    int rc = scan_records(d, &cx, NULL, NULL, err, errlen);
    disk_scan_t *sc = &d->scan;
    d->torn = sc->torn;
    d->deleted = sc->deleted;
    settle_watermarks(d, sc->max_seq);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < sc->n; i++)
        slot_take(d, sc->recs[i].slot);
    d->recovered = sc->n;
    return 0;
}

int disk_scan_run(disk_t *d, disk_scan_t *out, const atomic_bool *stop,
                  atomic_uint_fast64_t *progress, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!d->scan_pending)
        return 0;
    scan_ctx_t cx = {.tab = d->scan_tab, .n_tab = d->scan_tab_n, .last = 0, .sc = out};
    return scan_records(d, &cx, stop, progress, err, errlen);
}

void disk_scan_settle(disk_t *d, const disk_scan_t *sc)
{
    if (!d->scan_pending)
        return;
    d->scan_pending = false;
    d->torn = sc->torn;
    d->deleted = sc->deleted;
    d->recovered = sc->n;
    settle_watermarks(d, sc->max_seq);
    disk_notes_flush(d); /* a watermark not written, said now */
}

bool disk_scan_pending(const disk_t *d)
{
    return d->scan_pending;
}

bool disk_record_deleted(disk_t *d, disk_record_t *r)
{
    r->entry = ns_find(d, r->ns);
    return r->entry != DISK_NO_ENTRY && r->seq < d->ns_tab[r->entry].valid_from;
}

void disk_take_scan(disk_t *d, disk_scan_t *out)
{
    *out = d->scan;
    memset(&d->scan, 0, sizeof(d->scan));
}

/* --- the namespace table --- */

static uint32_t ns_find(disk_t *d, const char *ns)
{
    if (d->ns_last < d->ns_count && strcmp(d->ns_tab[d->ns_last].ns, ns) == 0)
        return d->ns_last;
    for (uint32_t e = 0; e < d->ns_count; e++)
        if (strcmp(d->ns_tab[e].ns, ns) == 0)
            return d->ns_last = e;
    return DISK_NO_ENTRY;
}

/* Entry indexes, most recently used first. */
static int cmp_used(const void *a, const void *b, void *arg)
{
    const uint64_t *used = arg;
    uint64_t x = used[*(const uint32_t *)a], y = used[*(const uint32_t *)b];
    return x > y ? -1 : x < y;
}

/* The table into page[T_MAGIC, 4096): as many entries as fit, most
 * recently used first, each distinct identity text once. */
static void encode_table(const disk_t *d, uint8_t *page)
{
    uint32_t order[DISK_NS_SLOTS], text_of[DISK_NS_SLOTS], n_text = 0;
    uint8_t ents[DISK_ALIGN];
    size_t text_len = 0, ent_len = 0, room = DISK_ALIGN - T_BODY;
    uint16_t n_ent = 0;
    for (uint32_t e = 0; e < d->ns_count; e++)
        order[e] = e;
    qsort_r(order, d->ns_count, sizeof(*order), cmp_used, d->ns_used);
    uint8_t *texts = page + T_BODY;
    for (uint32_t k = 0; k < d->ns_count; k++) {
        const disk_ns_t *en = &d->ns_tab[order[k]];
        uint32_t t = 0;
        while (t < n_text && strcmp(d->ns_tab[text_of[t]].ident, en->ident) != 0)
            t++;
        size_t nl = strlen(en->ns), tl = strlen(en->ident);
        size_t need = 1 + nl + 1 + 1 + 8 + (t == n_text ? 8 + 2 + tl : 0);
        if (text_len + ent_len + need > room || (t == n_text && n_text == 255))
            continue; /* left out: its records are not restored (identity unknown) */
        if (t == n_text) {
            text_of[n_text++] = order[k];
            put64(texts + text_len, en->ident_hash);
            texts[text_len + 8] = (uint8_t)tl;
            texts[text_len + 9] = (uint8_t)(tl >> 8);
            memcpy(texts + text_len + 10, en->ident, tl);
            text_len += 10 + tl;
        }
        ents[ent_len++] = (uint8_t)nl;
        memcpy(ents + ent_len, en->ns, nl);
        ent_len += nl;
        ents[ent_len++] = (uint8_t)en->source;
        ents[ent_len++] = (uint8_t)t;
        put64(ents + ent_len, en->valid_from);
        ent_len += 8;
        n_ent++;
    }
    memcpy(texts + text_len, ents, ent_len);
    put32(page + T_MAGIC, TAB_MAGIC);
    put32(page + T_LEN, (uint32_t)(text_len + ent_len));
    page[T_NTEXT] = (uint8_t)n_text;
    page[T_NTEXT + 1] = 0;
    page[T_NENT] = (uint8_t)n_ent;
    page[T_NENT + 1] = (uint8_t)(n_ent >> 8);
    put32(page + T_CRC, crc32c(0, page + T_LEN, T_BODY - T_LEN + text_len + ent_len));
}

/* The table from the superblock page. A page written before any table
 * (zeros) is an empty one; a damaged one too, said once: every record's
 * identity is then unknown and none is restored. */
static void decode_table(disk_t *d, const uint8_t *page, const char *path)
{
    d->ns_count = 0;
    if (get32(page + T_MAGIC) == 0)
        return;
    uint32_t len = get32(page + T_LEN);
    if (get32(page + T_MAGIC) != TAB_MAGIC || len > DISK_ALIGN - T_BODY ||
        get32(page + T_CRC) != crc32c(0, page + T_LEN, T_BODY - T_LEN + len)) {
        disk__note(d, DISK_NOTE_WARN,
                   "%s: the namespace table does not verify: no record's identity is known, "
                   "none is restored",
                   path);
        return;
    }
    const uint8_t *p = page + T_BODY, *end = p + len;
    uint32_t n_text = page[T_NTEXT], n_ent = page[T_NENT] | (uint32_t)page[T_NENT + 1] << 8;
    const uint8_t *text_at[256];
    for (uint32_t t = 0; t < n_text; t++) {
        if (end - p < 10 || (size_t)(end - p) < 10u + (p[8] | (size_t)p[9] << 8))
            goto bad;
        text_at[t] = p;
        p += 10 + (p[8] | (size_t)p[9] << 8);
    }
    for (uint32_t e = 0; e < n_ent && d->ns_count < DISK_NS_SLOTS; e++) {
        if (p >= end || (size_t)(end - p) < 11u + p[0])
            goto bad;
        size_t nl = p[0];
        uint32_t t = p[1 + nl + 1];
        size_t tl = t < n_text ? (text_at[t][8] | (size_t)text_at[t][9] << 8) : 0;
        if (nl >= DISK_NS_MAX || t >= n_text || tl > DISK_IDENT_MAX)
            goto bad;
        disk_ns_t *en = &d->ns_tab[d->ns_count++];
        memset(en, 0, sizeof(*en));
        memcpy(en->ns, p + 1, nl);
        en->source = p[1 + nl];
        en->valid_from = get64(p + 1 + nl + 2);
        en->ident_hash = get64(text_at[t]);
        memcpy(en->ident, text_at[t] + 10, tl);
        d->ns_used[d->ns_count - 1] = 0;
        p += 1 + nl + 2 + 8;
    }
    return;
bad:
    d->ns_count = 0;
    disk__note(d, DISK_NOTE_WARN,
               "%s: the namespace table is malformed: none of its records is restored", path);
}

static void encode_sb(const disk_t *d, uint8_t *sb)
{
    memset(sb, 0, DISK_ALIGN);
    encode_table(d, sb);
    put64(sb + S_MAGIC, SB_MAGIC);
    put32(sb + S_FORMAT, DISK_FORMAT);
    put32(sb + S_TOKENS, d->block_tokens);
    put64(sb + S_BLOCK, d->block_bytes);
    put64(sb + S_GEO, d->geometry_id);
    put64(sb + S_SLOT, d->slot_bytes);
    put64(sb + S_NSLOTS, d->nslots);
    put32(sb + S_CRC, crc32c(0, sb, S_CRC));
}

/* The superblock page (superblock and table) to the file. */
static int write_page(disk_t *d, char *err, size_t errlen)
{
    encode_sb(d, d->page);
    ssize_t w;
    do {
        w = pwrite(d->fd, d->page, DISK_ALIGN, 0);
    } while (w < 0 && errno == EINTR);
    if (w != (ssize_t)DISK_ALIGN) {
        seterr(err, errlen, "writing the namespace table failed: %s",
               w < 0 ? strerror(errno) : "short write");
        return KVS_EIO;
    }
    return 0;
}

/* The entry of ns, made (in place of the least recently used one when the
 * table is full) with its watermark at the next sequence number when there
 * is none or it names another identity. *changed: it was. */
static uint32_t ns_entry(disk_t *d, const char *ns, uint64_t ident_hash, uint32_t source,
                         const char *ident, bool *changed)
{
    uint32_t e = ns_find(d, ns);
    /* Only a new entry or another identity moves the watermark: the same
     * identity declared (a source that says more) keeps its records. */
    bool other = e == DISK_NO_ENTRY || d->ns_tab[e].ident_hash != ident_hash;
    *changed = other || d->ns_tab[e].source != source;
    if (e == DISK_NO_ENTRY && d->ns_count < DISK_NS_SLOTS) {
        e = d->ns_count++;
    } else if (e == DISK_NO_ENTRY) {
        e = 0;
        for (uint32_t k = 1; k < d->ns_count; k++)
            if (d->ns_used[k] < d->ns_used[e])
                e = k;
    }
    d->ns_used[e] = ++d->ns_clock;
    disk_ns_t *en = &d->ns_tab[e];
    if (other) {
        memset(en, 0, sizeof(*en));
        snprintf(en->ns, sizeof(en->ns), "%s", ns);
        snprintf(en->ident, sizeof(en->ident), "%s", ident ? ident : "");
        en->ident_hash = ident_hash;
        en->valid_from = d->scan_pending ? DISK_SEQ_ALL : atomic_load(&d->next_seq);
        d->ns_last = e;
    }
    en->source = source;
    return e;
}

int disk_ns_note(disk_t *d, const char *ns, uint64_t ident_hash, uint32_t source, const char *ident,
                 char *err, size_t errlen)
{
    bool changed;
    ns_entry(d, ns, ident_hash, source, ident, &changed);
    return changed ? write_page(d, err, errlen) : 0;
}

int disk_ns_delete(disk_t *d, const char *ns, uint64_t ident_hash, uint32_t source,
                   const char *ident, char *err, size_t errlen)
{
    bool changed;
    uint32_t e = ns_entry(d, ns, ident_hash, source, ident, &changed);
    /* While a deferred scan runs, the next sequence number is not known
     * yet, and nothing is written: every record on the disk is deleted. */
    d->ns_tab[e].valid_from = d->scan_pending ? DISK_SEQ_ALL : atomic_load(&d->next_seq);
    return write_page(d, err, errlen);
}

int disk_sync(disk_t *d)
{
    return fdatasync(d->fd) == 0 ? 0 : KVS_EIO;
}

static void *sync_main(void *arg)
{
    disk_t *d = arg;
    if (disk_sync(d) != 0)
        disk__note(d, DISK_NOTE_ERROR,
                   "fdatasync after a deletion failed (%s): a power loss could undo it",
                   strerror(errno));
    atomic_fetch_sub(&d->syncing, 1);
    return NULL;
}

void disk_sync_async(disk_t *d)
{
    pthread_t t;
    pthread_attr_t attr;
    atomic_fetch_add(&d->syncing, 1);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, sync_main, d);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        sync_main(d); /* no thread for it: here */
}

int disk_ns_get(const disk_t *d, uint32_t entry, disk_ns_t *out)
{
    if (entry >= d->ns_count)
        return KVS_ENOTFOUND;
    *out = d->ns_tab[entry];
    return 0;
}

int disk_forget(disk_t *d, const uint32_t *slots, size_t n, char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    uint8_t *tomb = disk_buffer_alloc(DISK_ALIGN);
    if (!tomb) {
        seterr(err, errlen, "no memory for a tombstone's page");
        return KVS_ENOMEM;
    }
    memset(tomb, 0, DISK_ALIGN);
    put32(tomb + H_MAGIC, TOMB_MAGIC);
    int rc = 0, e = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (slots[i] >= d->nslots)
            continue;
        ssize_t w;
        do {
            w = pwrite(d->fd, tomb, DISK_ALIGN, (off_t)disk__slot_offset(d, slots[i]));
        } while (w < 0 && errno == EINTR);
        if (w != (ssize_t)DISK_ALIGN) {
            e = w < 0 ? errno : 0;
            rc = KVS_EIO;
        }
    }
    if (rc != 0)
        seterr(err, errlen, "writing a tombstone failed: %s", e ? strerror(e) : "short write");
    free(tomb);
    return rc;
}

/* Why the superblock in sb does not fit d, or NULL when it does. */
static const char *sb_mismatch(const disk_t *d, const uint8_t *sb)
{
    if (get64(sb + S_MAGIC) != SB_MAGIC || get32(sb + S_CRC) != crc32c(0, sb, S_CRC))
        return "it is not a kvshare disk tier file (or its superblock is damaged)";
    if (get32(sb + S_FORMAT) != DISK_FORMAT)
        return "it was written in another format version";
    if (get32(sb + S_TOKENS) != d->block_tokens || get64(sb + S_BLOCK) != d->block_bytes ||
        get64(sb + S_GEO) != d->geometry_id || get64(sb + S_SLOT) != d->slot_bytes)
        return "it was written for another block geometry";
    if (get64(sb + S_NSLOTS) != d->nslots)
        return "it was written with another disk_tier_bytes";
    return NULL;
}

/* Sizes the file to file_bytes with fallocate (zeroes: blank slots) and
 * writes the superblock. */
static int format_file(disk_t *d, uint8_t *sb, const char *path, char *err, size_t errlen)
{
    if (ftruncate(d->fd, 0) != 0 || fallocate(d->fd, 0, 0, (off_t)d->file_bytes) != 0) {
        int e = errno;
        seterr(err, errlen, "disk_tier_bytes: cannot preallocate %llu bytes for %s: %s",
               (unsigned long long)d->file_bytes, path, strerror(e));
        return e == EOPNOTSUPP ? KVS_ENOTSUP : KVS_EIO;
    }
    d->ns_count = 0; /* a new file names no namespace */
    encode_sb(d, sb);
    if (pwrite(d->fd, sb, DISK_ALIGN, 0) != (ssize_t)DISK_ALIGN || fsync(d->fd) != 0) {
        seterr(err, errlen, "disk_tier_path: writing %s failed: %s", path, strerror(errno));
        return KVS_EIO;
    }
    return 0;
}

/* --- the file's path: nobody else's doing ---
 *
 * The file holds tenants' KV and the daemon serves what it reads there, so
 * no other user may have put it there, point it elsewhere or change it:
 * every directory on the way (symbolic links resolved) belongs to the
 * daemon's user or root and only they can write it (or it is sticky, like
 * /tmp, where nobody else can replace an entry of ours); a symbolic link on
 * the way belongs to them too; the file itself is never a link (O_NOFOLLOW),
 * is a regular file (a FIFO or a device is refused by type, never opened
 * blocking), belongs to the daemon's user and nobody else can write it. The
 * opened descriptor is checked again (fstat): what was checked is what is
 * used. */

static int mode_refusal(const char *what, const char *name, const struct stat *st, char *err,
                        size_t errlen)
{
    seterr(err, errlen,
           "disk_tier_path: %s %s (owner uid %u, mode %04o) is writable by %s: they could "
           "change what kvshared reads and serves; chmod go-w it",
           what, name, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777),
           (st->st_mode & S_IWOTH) ? "every user" : "its group");
    return KVS_EDENIED;
}

/* Directory `dir` (lstat'ed into st, no link) is one kvshared may keep its
 * file under. */
static int check_dir(const char *dir, const struct stat *st, uid_t uid, char *err, size_t errlen)
{
    if (!S_ISDIR(st->st_mode)) {
        seterr(err, errlen, "disk_tier_path: %s is not a directory", dir);
        return KVS_EINVAL;
    }
    if (uid != DISK_ANY_UID && st->st_uid != uid && st->st_uid != 0) {
        seterr(err, errlen,
               "disk_tier_path: the directory %s (owner uid %u, mode %04o) belongs neither to "
               "kvshared's uid %u nor to root: its owner could replace the file; give a "
               "directory kvshared owns",
               dir, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), (unsigned)uid);
        return KVS_EDENIED;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
        return mode_refusal("the directory", dir, st, err, errlen);
    return 0;
}

/* The file as found at path (lstat'ed into st): a regular file of uid that
 * nobody else can write. */
static int check_file(const char *path, const struct stat *st, uid_t uid, char *err, size_t errlen)
{
    if (S_ISLNK(st->st_mode)) {
        seterr(err, errlen,
               "disk_tier_path: %s is a symbolic link (owner uid %u): it is never followed; give "
               "the file's own path",
               path, (unsigned)st->st_uid);
        return KVS_EDENIED;
    }
    if (!S_ISREG(st->st_mode)) {
        seterr(err, errlen, "disk_tier_path: %s is not a regular file (mode %06o); give a file",
               path, (unsigned)st->st_mode);
        return KVS_EINVAL;
    }
    if (uid != DISK_ANY_UID && st->st_uid != uid) {
        seterr(err, errlen,
               "disk_tier_path: %s (owner uid %u, mode %04o) does not belong to kvshared's uid "
               "%u: another user may have made it to feed kvshared blocks; remove it (kvshared "
               "creates its own)",
               path, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), (unsigned)uid);
        return KVS_EDENIED;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return mode_refusal("the file", path, st, err, errlen);
    return 0;
}

int disk_check_path(const char *path, uid_t uid, char *err, size_t errlen)
{
    char dir[PATH_MAX], real[PATH_MAX];
    struct stat st;
    if (!path || !*path || strlen(path) >= sizeof(dir)) {
        seterr(err, errlen, "disk_tier_path: give a path of 1 to %d bytes", PATH_MAX - 1);
        return KVS_EINVAL;
    }
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    /* Each link on the way as written: its owner chose where it leads. */
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char was = *p;
        *p = '\0';
        if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode) && st.st_uid != uid && st.st_uid != 0 &&
            uid != DISK_ANY_UID) {
            seterr(err, errlen,
                   "disk_tier_path: %s is a symbolic link of uid %u, neither kvshared's uid %u "
                   "nor root: its owner decides where the file goes; give a path without it",
                   dir, (unsigned)st.st_uid, (unsigned)uid);
            return KVS_EDENIED;
        }
        *p = was;
        if (!was)
            break;
    }
    if (!realpath(dir, real)) {
        seterr(err, errlen, "disk_tier_path: the directory of %s does not exist (%s)", path,
               strerror(errno));
        return KVS_EINVAL;
    }
    /* Every directory from the root down to the file's. */
    size_t len = strlen(real);
    for (size_t end = 1; end <= len; end++) {
        if (end < len && real[end] != '/')
            continue;
        char was = real[end];
        real[end] = '\0';
        int rc = 0;
        if (lstat(real, &st) != 0) {
            seterr(err, errlen, "disk_tier_path: %s cannot be checked: %s", real, strerror(errno));
            rc = KVS_EINVAL;
        } else {
            rc = check_dir(real, &st, uid, err, errlen);
        }
        real[end] = was;
        if (rc != 0)
            return rc;
    }
    if (lstat("/", &st) == 0 && check_dir("/", &st, uid, err, errlen) != 0)
        return KVS_EDENIED;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : KVS_EINVAL;
    return check_file(path, &st, uid, err, errlen);
}

/* Who holds a lock on the file open as fd, from /proc/locks: "pid N (comm,
 * uid U)", or "" when it cannot be told. */
static void lock_holder(int fd, char *out, size_t outlen)
{
    struct stat st;
    out[0] = '\0';
    FILE *f = fstat(fd, &st) == 0 ? fopen("/proc/locks", "re") : NULL;
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        unsigned maj, min;
        unsigned long long ino;
        long pid;
        char kind[16];
        /* "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" */
        if (sscanf(line, "%*d: %15s %*s %*s %ld %x:%x:%llu", kind, &pid, &maj, &min, &ino) != 5 ||
            ino != (unsigned long long)st.st_ino || maj != major(st.st_dev) ||
            min != minor(st.st_dev) || pid == (long)getpid())
            continue;
        char proc[64], comm[64] = "?";
        struct stat ps;
        snprintf(proc, sizeof(proc), "/proc/%ld/comm", pid);
        FILE *c = fopen(proc, "re");
        if (c) {
            if (fgets(comm, sizeof(comm), c))
                comm[strcspn(comm, "\n")] = '\0';
            fclose(c);
        }
        snprintf(proc, sizeof(proc), "/proc/%ld", pid);
        if (stat(proc, &ps) == 0)
            snprintf(out, outlen, " (%s lock held by pid %ld, %s, uid %u)", kind, pid, comm,
                     (unsigned)ps.st_uid);
        else
            snprintf(out, outlen, " (%s lock held by pid %ld)", kind, pid);
        break;
    }
    fclose(f);
}

static int open_fd(disk_t *d, const disk_config_t *cfg, bool *created, char *err, size_t errlen)
{
    *created = false;
    int rc = disk_check_path(cfg->path, geteuid(), err, errlen);
    if (rc != 0)
        return rc;
    /* O_NONBLOCK: whatever is there now, the open does not wait for it
     * (a FIFO put there since the check); cleared below, for the disk. */
    int flags = O_RDWR | O_DIRECT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;
    int fd = open(cfg->path, flags);
    if (fd < 0 && errno == ENOENT) {
        fd = open(cfg->path, flags | O_CREAT | O_EXCL, 0600);
        *created = fd >= 0;
    }
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            seterr(err, errlen, "disk_tier_path: %s is a symbolic link: it is never followed",
                   cfg->path);
        else if (e == ENOENT)
            seterr(err, errlen, "disk_tier_path: the directory of %s does not exist", cfg->path);
        else if (e == EINVAL)
            seterr(err, errlen, "disk_tier_path: %s is on a file system without O_DIRECT",
                   cfg->path);
        else if (e == EACCES || e == EROFS || e == EPERM)
            seterr(err, errlen, "disk_tier_path: %s cannot be opened for writing: %s", cfg->path,
                   strerror(e));
        else
            seterr(err, errlen, "disk_tier_path: cannot open %s: %s", cfg->path, strerror(e));
        return e == ELOOP ? KVS_EDENIED : KVS_EINVAL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        seterr(err, errlen, "disk_tier_path: cannot stat %s: %s", cfg->path, strerror(errno));
        rc = KVS_EIO;
    } else {
        rc = check_file(cfg->path, &st, geteuid(), err, errlen);
    }
    /* io_uring would fail a read that has to wait with EAGAIN on a
     * non-blocking file instead of waiting for the disk. */
    if (rc == 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        seterr(err, errlen, "disk_tier_path: %s: %s", cfg->path, strerror(errno));
        rc = KVS_EIO;
    }
    if (rc == 0 && (st.st_mode & (S_IRGRP | S_IROTH)))
        disk__note(d, DISK_NOTE_WARN,
                   "%s (mode %04o) can be read by %s: it holds the KV of every tenant's prompts "
                   "(and a reader can lock it); chmod go-r it",
                   cfg->path, (unsigned)(st.st_mode & 07777),
                   (st.st_mode & S_IROTH) ? "every user" : "its group");
    /* Two daemons writing one file would tear each other's slots. A
     * daemon killed a moment ago may still hold the lock: the kernel
     * closes its file after its io_uring's last I/O, asynchronously. */
    int e = 0;
    for (int tries = 0; rc == 0 && tries < 200; tries++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        e = errno;
        if (e != EWOULDBLOCK)
            break;
        usleep(10 * 1000);
    }
    if (rc == 0) {
        char who[160] = "";
        if (e == EWOULDBLOCK)
            lock_holder(fd, who, sizeof(who));
        seterr(err, errlen, "disk_tier_path: %s is in use by another process%s%s", cfg->path,
               e == EWOULDBLOCK ? "" : " (it cannot be locked)", who);
        rc = KVS_EBUSY;
    }
    close(fd);
    *created = false; /* whoever holds it keeps it */
    return rc;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static int geometry(disk_t *d, const disk_config_t *cfg, char *err, size_t errlen)
{
    if (!cfg->path || !*cfg->path || cfg->block_bytes == 0 || cfg->block_tokens == 0 ||
        cfg->block_bytes > UINT32_MAX) {
        seterr(err, errlen, "disk tier: a path, a block size and block tokens are needed");
        return KVS_EINVAL;
    }
    d->block_bytes = cfg->block_bytes;
    d->block_tokens = cfg->block_tokens;
    d->geometry_id = cfg->geometry_id;
    d->ident_off = DISK_HDR_FIXED + 4ull * cfg->block_tokens;
    d->hdr_bytes = d->ident_off + 8;
    /* A block of whole pages starts on a page, after the header's own
     * page(s): in page-aligned memory it goes to and from the disk in place,
     * and the slot is no larger than header and block packed. A smaller
     * block follows its header (no in-place I/O, no page wasted). */
    d->direct_ok = d->block_bytes % DISK_ALIGN == 0;
    d->pay_off = d->direct_ok ? round_up(d->hdr_bytes, DISK_ALIGN) : d->hdr_bytes;
    d->slot_bytes = round_up(d->pay_off + d->block_bytes, DISK_ALIGN);
    uint64_t n = cfg->bytes > DISK_ALIGN ? (cfg->bytes - DISK_ALIGN) / d->slot_bytes : 0;
    if (n == 0 || n >= UINT32_MAX) {
        seterr(err, errlen,
               "disk_tier_bytes: %llu bytes %s (a slot takes %llu bytes, the superblock %u)",
               (unsigned long long)cfg->bytes, n == 0 ? "is too small" : "is too large",
               (unsigned long long)d->slot_bytes, DISK_ALIGN);
        return KVS_EINVAL;
    }
    d->nslots = (uint32_t)n;
    d->file_bytes = DISK_ALIGN + n * d->slot_bytes;
    /* (a slot is rounded up to a page: its pad is under one) */
    static const uint8_t zeros[DISK_ALIGN];
    uint64_t pad = d->slot_bytes - d->pay_off - d->block_bytes;
    d->pad_crc = crc32c(0, zeros, pad);
    d->pad_shift = crc32c_shift(pad);
    d->body_shift = crc32c_shift(d->slot_bytes - d->pay_off);
    return 0;
}

static int alloc_slots(disk_t *d)
{
    size_t n = d->nslots;
    d->prev = malloc(n * sizeof(uint32_t));
    d->next = malloc(n * sizeof(uint32_t));
    d->free_stack = malloc(n * sizeof(uint32_t));
    d->free_pos = malloc(n * sizeof(uint32_t));
    d->used = calloc(n, 1);
    d->ns_tab = calloc(DISK_NS_SLOTS, sizeof(*d->ns_tab));
    d->scan_tab = calloc(DISK_NS_SLOTS, sizeof(*d->scan_tab));
    d->ns_used = calloc(DISK_NS_SLOTS, sizeof(*d->ns_used));
    d->page = disk_buffer_alloc(DISK_ALIGN);
    if (!d->prev || !d->next || !d->free_stack || !d->free_pos || !d->used || !d->ns_tab ||
        !d->scan_tab || !d->ns_used || !d->page)
        return KVS_ENOMEM;
    d->head = d->tail = DISK_NO_SLOT;
    /* Lowest slots first off the stack. */
    for (size_t i = 0; i < n; i++) {
        d->free_stack[i] = (uint32_t)(n - 1 - i);
        d->free_pos[n - 1 - i] = (uint32_t)i;
    }
    d->nfree = (uint32_t)n;
    return 0;
}

/* The superblock: a new file is formatted, an existing one checked (and
 * scanned), or wiped when it does not fit and cfg->wipe. */
static int attach_file(disk_t *d, const disk_config_t *cfg, bool created, char *err, size_t errlen)
{
    uint8_t *sb;
    if (posix_memalign((void **)&sb, DISK_ALIGN, DISK_ALIGN) != 0)
        return KVS_ENOMEM;
    int rc = 0;
    struct stat st;
    if (fstat(d->fd, &st) != 0 || created || st.st_size == 0) {
        rc = format_file(d, sb, cfg->path, err, errlen);
    } else {
        ssize_t got = pread(d->fd, sb, DISK_ALIGN, 0);
        const char *why =
            got == (ssize_t)DISK_ALIGN ? sb_mismatch(d, sb) : "it is shorter than a superblock";
        if (!why && (uint64_t)st.st_size < d->file_bytes)
            why = "it is shorter than its superblock says";
        if (why && cfg->wipe) {
            disk__note(d, DISK_NOTE_WARN, "%s: %s; wiping it (disk_tier_wipe)", cfg->path, why);
            rc = format_file(d, sb, cfg->path, err, errlen);
        } else if (why) {
            seterr(err, errlen, "disk_tier_path: %s is refused: %s (disk_tier_wipe starts it over)",
                   cfg->path, why);
            rc = KVS_EINVAL;
        } else {
            decode_table(d, sb, cfg->path);
            if (cfg->defer_scan) {
                /* disk_scan_run reads the records later, against the
                 * watermarks of now. */
                d->scan_pending = true;
                d->scan_tab_n = d->ns_count;
                memcpy(d->scan_tab, d->ns_tab, d->ns_count * sizeof(*d->ns_tab));
            } else {
                rc = scan_file(d, err, errlen);
            }
        }
    }
    free(sb);
    return rc;
}

int disk_open(const disk_config_t *cfg, disk_t **out, char *err, size_t errlen)
{
    disk_t *d = calloc(1, sizeof(*d));
    if (!d)
        return KVS_ENOMEM;
    d->fd = -1;
    atomic_init(&d->next_seq, 1);
    pthread_mutex_init(&d->notes_mu, NULL);
    d->note = cfg->note;
    d->note_arg = cfg->note_arg;
    int rc = geometry(d, cfg, err, errlen);
    bool created = false;
    if (rc == 0) {
        d->fd = open_fd(d, cfg, &created, err, errlen);
        if (d->fd < 0)
            rc = d->fd;
    }
    if (rc == 0 && (rc = alloc_slots(d)) != 0)
        seterr(err, errlen, "disk tier: out of memory for %u slots", d->nslots);
    if (rc == 0)
        rc = attach_file(d, cfg, created, err, errlen);
    uint32_t qd = cfg->queue_depth ? cfg->queue_depth : 64;
    if (rc == 0 && qd < 32) {
        seterr(err, errlen, "disk tier: queue depth %u is under 32", qd);
        rc = KVS_EINVAL;
    }
    if (rc == 0)
        rc = disk__engine_start(d, cfg->io, qd, err, errlen);
    if (rc != 0) {
        if (created)
            unlink(cfg->path);
        disk_close(d);
        return rc;
    }
    disk_notes_flush(d);
    *out = d;
    return 0;
}

void disk_close(disk_t *d)
{
    if (!d)
        return;
    if (d->eng)
        disk__engine_stop(d);
    while (atomic_load(&d->syncing) > 0) /* an fdatasync: milliseconds */
        usleep(1000);
    disk_notes_flush(d); /* no thread is left to make one */
    if (d->fd >= 0)
        close(d->fd);
    disk_scan_free(&d->scan);
    free(d->prev);
    free(d->next);
    free(d->free_stack);
    free(d->free_pos);
    free(d->used);
    free(d->ns_tab);
    free(d->scan_tab);
    free(d->ns_used);
    free(d->page);
    pthread_mutex_destroy(&d->notes_mu);
    free(d);
}

uint32_t disk_capacity(const disk_t *d)
{
    return d->nslots;
}

#define HUGE_PAGE (2u << 20)

void *disk_buffer_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE) {
        void *p = NULL;
        return posix_memalign(&p, DISK_ALIGN, bytes) == 0 ? p : NULL;
    }
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, len) != 0)
        return NULL;
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: EINVAL where THP is not built in */
    return p;
}

uint64_t disk_slot_bytes(const disk_t *d)
{
    return d->slot_bytes;
}

const char *disk_io_name(const disk_t *d)
{
    return d->io_name;
}

void disk_stats(const disk_t *d, disk_stats_t *out)
{
    disk_t *t = (disk_t *)d; /* atomics are read, never written */
    *out = (disk_stats_t){
        .io = d->io_name,
        .slots = d->nslots,
        .used = d->nused,
        .reads = atomic_load(&t->reads),
        .writes = atomic_load(&t->writes),
        .read_bytes = atomic_load(&t->read_bytes),
        .write_bytes = atomic_load(&t->write_bytes),
        .io_errors = atomic_load(&t->io_errors),
        .crc_failures = atomic_load(&t->crc_failures),
        .mismatches = atomic_load(&t->mismatches),
        .evictions = d->evictions,
        .recovered = d->recovered,
        .torn = d->torn,
        .deleted = d->deleted,
    };
}
