/* SPDX-License-Identifier: Apache-2.0 */
/* trace.c: reader of the JSONL request trace and its token expansion. */
#include "trace.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvshare_status.h"

typedef struct parser {
    const char *p;
    const char *end;
} parser_t;

static void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r'))
        ps->p++;
}

static bool expect(parser_t *ps, char c)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return true;
    }
    return false;
}

/* A non-negative integer of at most 19 digits. */
static bool parse_uint(parser_t *ps, uint64_t *v)
{
    skip_ws(ps);
    uint64_t x = 0;
    int digits = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9' && digits < 19) {
        x = x * 10 + (uint64_t)(*ps->p - '0');
        ps->p++;
        digits++;
    }
    if (digits == 0 || (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9'))
        return false;
    *v = x;
    return true;
}

/* A string without escapes, into key (truncated to key_len - 1). */
static bool parse_key(parser_t *ps, char *key, size_t key_len)
{
    if (!expect(ps, '"'))
        return false;
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != '"') {
        if (*ps->p == '\\')
            return false;
        if (n + 1 < key_len)
            key[n++] = *ps->p;
        ps->p++;
    }
    key[n] = '\0';
    return expect(ps, '"');
}

typedef struct id_buf {
    uint32_t *ids;
    size_t n, cap;
} id_buf_t;

static int push_id(id_buf_t *b, uint32_t id)
{
    if (b->n == b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        uint32_t *a = realloc(b->ids, ncap * sizeof(*a));
        if (!a)
            return KVS_ENOMEM;
        b->ids = a;
        b->cap = ncap;
    }
    b->ids[b->n++] = id;
    return 0;
}

/* Parses one line into *r, appending its ids to b. Returns NULL or what is
 * wrong with the line. */
static const char *parse_line(const char *line, size_t len, trace_req_t *r, id_buf_t *b, int *rc)
{
    parser_t ps = {line, line + len};
    bool have_ts = false, have_in = false, have_ids = false;
    memset(r, 0, sizeof(*r));
    r->first_hash = b->n;
    *rc = KVS_EINVAL;
    if (!expect(&ps, '{'))
        return "expected '{'";
    if (expect(&ps, '}'))
        return "empty object";
    do {
        char key[32];
        if (!parse_key(&ps, key, sizeof(key)))
            return "expected a key";
        if (!expect(&ps, ':'))
            return "expected ':'";
        uint64_t v;
        if (strcmp(key, "hash_ids") == 0) {
            if (!expect(&ps, '['))
                return "hash_ids: expected '['";
            if (!expect(&ps, ']')) {
                do {
                    if (!parse_uint(&ps, &v) || v > UINT32_MAX - 1)
                        return "hash_ids: expected an id below 2^32 - 1";
                    if (push_id(b, (uint32_t)v)) {
                        *rc = KVS_ENOMEM;
                        return "out of memory";
                    }
                } while (expect(&ps, ','));
                if (!expect(&ps, ']'))
                    return "hash_ids: expected ',' or ']'";
            }
            have_ids = true;
        } else {
            if (!parse_uint(&ps, &v))
                return "expected a non-negative integer";
            if (strcmp(key, "timestamp") == 0) {
                r->timestamp_ms = v;
                have_ts = true;
            } else if (strcmp(key, "input_length") == 0) {
                if (v > UINT32_MAX)
                    return "input_length too large";
                r->input_length = (uint32_t)v;
                have_in = true;
            } else if (strcmp(key, "output_length") == 0) {
                if (v > UINT32_MAX)
                    return "output_length too large";
                r->output_length = (uint32_t)v;
            }
        }
    } while (expect(&ps, ','));
    if (!expect(&ps, '}'))
        return "expected ',' or '}'";
    skip_ws(&ps);
    if (ps.p != ps.end)
        return "text after the object";
    if (!have_ts || !have_in || !have_ids)
        return "missing timestamp, input_length or hash_ids";
    r->n_hash = (uint32_t)(b->n - r->first_hash);
    *rc = 0;
    return NULL;
}

int trace_load(const char *path, size_t max_reqs, trace_t *out, char *err, size_t err_len)
{
    int rc = KVS_EINVAL;
    char *line = NULL;
    size_t line_cap = 0, cap = 0, lineno = 0;
    id_buf_t b = {0};
    trace_t t = {0};
    FILE *f = NULL;
    if (!path || !out)
        goto out;
    memset(out, 0, sizeof(*out));
    f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        rc = KVS_EIO;
        goto out;
    }
    ssize_t len;
    rc = 0;
    while ((max_reqs == 0 || t.n_reqs < max_reqs) && (len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len == 0)
            continue;
        if (t.n_reqs == cap) {
            size_t ncap = cap ? cap * 2 : 1024;
            trace_req_t *a = realloc(t.reqs, ncap * sizeof(*a));
            if (!a) {
                rc = KVS_ENOMEM;
                break;
            }
            t.reqs = a;
            cap = ncap;
        }
        const char *what = parse_line(line, (size_t)len, &t.reqs[t.n_reqs], &b, &rc);
        if (what) {
            snprintf(err, err_len, "%s:%zu: %s", path, lineno, what);
            break;
        }
        t.n_reqs++;
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, err_len, "%s: read error", path);
        rc = KVS_EIO;
    }
    fclose(f);
    if (rc)
        goto out;
    t.hash_ids = b.ids;
    t.n_hash_ids = b.n;
    b.ids = NULL;
    for (size_t i = 0; i < t.n_hash_ids; i++)
        if (t.hash_ids[i] > t.max_hash_id)
            t.max_hash_id = t.hash_ids[i];
    *out = t;
    t.reqs = NULL;
out:
    free(line);
    free(b.ids);
    free(t.reqs);
    return rc;
}

int trace_next_uses(const trace_t *t, size_t **next)
{
    size_t *out = malloc((t->n_hash_ids ? t->n_hash_ids : 1) * sizeof(*out));
    size_t *last = malloc(((size_t)t->max_hash_id + 1) * sizeof(*last));
    if (!out || !last) {
        free(out);
        free(last);
        return KVS_ENOMEM;
    }
    for (size_t i = 0; i <= t->max_hash_id; i++)
        last[i] = SIZE_MAX;
    for (size_t r = t->n_reqs; r-- > 0;) {
        const trace_req_t *q = &t->reqs[r];
        for (uint32_t u = 0; u < q->n_hash; u++) {
            uint32_t id = t->hash_ids[q->first_hash + u];
            out[q->first_hash + u] = last[id];
            last[id] = r;
        }
    }
    free(last);
    *next = out;
    return 0;
}

void trace_free(trace_t *t)
{
    if (!t)
        return;
    free(t->reqs);
    free(t->hash_ids);
    memset(t, 0, sizeof(*t));
}

size_t trace_prompt_tokens(const trace_t *t, const trace_req_t *r)
{
    (void)t;
    size_t most = (size_t)r->n_hash * TRACE_HASH_TOKENS;
    return r->input_length < most ? r->input_length : most;
}

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

void trace_expand(const trace_t *t, const trace_req_t *r, uint32_t *tokens)
{
    size_t n = trace_prompt_tokens(t, r);
    for (size_t k = 0; k < n; k++) {
        uint64_t id = t->hash_ids[r->first_hash + k / TRACE_HASH_TOKENS];
        uint64_t pos = k % TRACE_HASH_TOKENS;
        tokens[k] = (uint32_t)(mix64((id + 1) * 0x9E3779B97F4A7C15ull + pos) % TRACE_VOCAB);
    }
}
