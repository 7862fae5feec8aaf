/* SPDX-License-Identifier: Apache-2.0 */
#include "workload.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Token j of stream (seed, stream): random access, so every process that
 * generates the same prompt gets the same tokens. */
static uint32_t draw_token(uint64_t seed, uint64_t stream, uint64_t j, uint32_t vocab)
{
    return (uint32_t)(mix64(mix64(seed ^ mix64(stream)) + j) % vocab);
}

static int workload_alloc(uint32_t count, workload_t **out)
{
    workload_t *w = calloc(1, sizeof(*w));

    if (!w)
        return KVS_ENOMEM;
    w->prompt = calloc(count ? count : 1, sizeof(*w->prompt));
    w->len = calloc(count ? count : 1, sizeof(*w->len));
    if (!w->prompt || !w->len) {
        workload_free(w);
        return KVS_ENOMEM;
    }
    *out = w;
    return 0;
}

int workload_chat(const workload_chat_opts_t *o, workload_t **out)
{
    workload_t *w = NULL;
    int rc;

    if (!o || !out || !o->requests || !o->systems || !o->vocab ||
        (!o->system_tokens && !o->question_tokens))
        return KVS_EINVAL;
    rc = workload_alloc(o->requests, &w);
    if (rc < 0)
        return rc;
    for (uint32_t r = 0; r < o->requests; r++) {
        uint64_t i = (uint64_t)o->first + r;
        uint32_t sys = (uint32_t)(i % o->systems);
        uint32_t q = o->question_tokens
                         ? o->question_tokens / 2 +
                               (uint32_t)(mix64(o->seed ^ (i << 1)) % (o->question_tokens + 1))
                         : 0;
        uint32_t n = o->system_tokens + q;
        uint32_t *p = malloc(sizeof(*p) * n);

        if (!p) {
            rc = KVS_ENOMEM;
            goto fail;
        }
        /* Streams: 2s for system prompt s, 2i+1 for question i: disjoint. */
        for (uint32_t j = 0; j < o->system_tokens; j++)
            p[j] = draw_token(o->seed, 2 * (uint64_t)sys, j, o->vocab);
        for (uint32_t j = 0; j < q; j++)
            p[o->system_tokens + j] = draw_token(o->seed, 2 * i + 1, j, o->vocab);
        w->prompt[r] = p;
        w->len[r] = n;
        w->count = r + 1;
    }
    *out = w;
    return 0;
fail:
    workload_free(w);
    return rc;
}

/* Appends one line's tokens as a prompt. Returns 0 with nothing added for a
 * blank or comment line. */
static int parse_line(workload_t *w, uint32_t *cap, const char *line, uint32_t vocab)
{
    uint32_t *p = NULL, n = 0, pcap = 0;
    const char *s = line;
    int rc;

    while (*s == ' ' || *s == '\t')
        s++;
    if (*s == '#' || *s == '\n' || *s == '\r' || *s == '\0')
        return 0;
    while (*s) {
        char *end;
        unsigned long v;

        if (*s == ' ' || *s == '\t' || *s == ',' || *s == '\n' || *s == '\r') {
            s++;
            continue;
        }
        if (!isdigit((unsigned char)*s)) {
            rc = KVS_EINVAL;
            goto fail;
        }
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || v >= vocab) {
            rc = KVS_EINVAL;
            goto fail;
        }
        if (n == pcap) {
            uint32_t ncap = pcap ? pcap * 2 : 256;
            uint32_t *np = realloc(p, sizeof(*p) * ncap);
            if (!np) {
                rc = KVS_ENOMEM;
                goto fail;
            }
            p = np, pcap = ncap;
        }
        p[n++] = (uint32_t)v;
        s = end;
    }
    if (!n)
        return 0; /* separators only */
    if (w->count == *cap) {
        uint32_t ncap = *cap * 2;
        uint32_t **np = realloc(w->prompt, sizeof(*np) * ncap);
        uint32_t *nl;
        if (!np) {
            rc = KVS_ENOMEM;
            goto fail;
        }
        w->prompt = np;
        nl = realloc(w->len, sizeof(*nl) * ncap);
        if (!nl) {
            rc = KVS_ENOMEM;
            goto fail;
        }
        w->len = nl;
        *cap = ncap;
    }
    w->prompt[w->count] = p;
    w->len[w->count++] = n;
    return 0;
fail:
    free(p);
    return rc;
}

int workload_load(const char *path, uint32_t vocab, workload_t **out)
{
    workload_t *w = NULL;
    FILE *f = NULL;
    char *line = NULL;
    size_t line_cap = 0;
    uint32_t cap = 16;
    int rc;

    if (!path || !out || !vocab)
        return KVS_EINVAL;
    f = fopen(path, "r");
    if (!f)
        return KVS_EIO;
    rc = workload_alloc(cap, &w);
    if (rc < 0)
        goto out;
    while (getline(&line, &line_cap, f) >= 0) {
        rc = parse_line(w, &cap, line, vocab);
        if (rc < 0)
            goto out;
    }
    if (ferror(f)) {
        rc = KVS_EIO;
        goto out;
    }
    rc = w->count ? 0 : KVS_EINVAL;
out:
    free(line);
    fclose(f);
    if (rc < 0)
        workload_free(w);
    else
        *out = w;
    return rc;
}

void workload_free(workload_t *w)
{
    if (!w)
        return;
    for (uint32_t i = 0; i < w->count; i++)
        free(w->prompt[i]);
    free(w->prompt);
    free(w->len);
    free(w);
}
