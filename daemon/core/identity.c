/* SPDX-License-Identifier: Apache-2.0 */
#include "identity.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvshare_status.h"

#define TEXT_TAG "kvs-id1"

const char *identity_source_name(identity_source_t src)
{
    switch (src) {
    case IDENTITY_DAEMON:
        return "daemon";
    case IDENTITY_DECLARED:
        return "declared";
    case IDENTITY_CONFIG:
        return "config";
    }
    return "?";
}

static bool printable(const char *s, bool spaces)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f || (!spaces && *p == ' '))
            return false;
    return true;
}

bool identity_model_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    return n >= 1 && n <= IDENTITY_MODEL_MAX && printable(name, true) && strcmp(name, "-") != 0;
}

bool identity_revision_valid(const char *rev)
{
    size_t n = rev ? strlen(rev) : 0;
    return n <= IDENTITY_REVISION_MAX && printable(rev ? rev : "", false) &&
           (!rev || strcmp(rev, "-") != 0);
}

int identity_make(const char *model, const char *revision, const geometry_t *geo, uint32_t tp_size,
                  identity_t *out)
{
    if (!geo || !out || tp_size == 0 || geometry_validate(geo) != 0)
        return KVS_EINVAL;
    if (model && model[0] && !identity_model_valid(model))
        return KVS_EINVAL;
    if (revision && revision[0] && !identity_revision_valid(revision))
        return KVS_EINVAL;
    geometry_t g = *geo; /* geo may be out's own */
    memset(out, 0, sizeof(*out));
    out->geo = g;
    if (model)
        memcpy(out->model, model, strlen(model) + 1);
    if (revision)
        memcpy(out->revision, revision, strlen(revision) + 1);
    out->tp_size = tp_size;
    return 0;
}

int identity_text(const identity_t *id, char *buf, size_t len)
{
    const geometry_t *g = &id->geo;
    const char *dtype = geometry_dtype_name(g->dtype);
    return snprintf(buf, len,
                    TEXT_TAG " %s layers=%u kv_heads=%u head_dim=%u planes=%u lora=%u rope=%u "
                             "block_tokens=%u tp=%u revision=%s model=%s",
                    dtype ? dtype : "?", g->layers, g->kv_heads, g->head_dim, geometry_planes(g),
                    g->kv_lora_rank, g->rope_head_dim, g->block_tokens, id->tp_size,
                    id->revision[0] ? id->revision : "-", id->model[0] ? id->model : "-");
}

/* Reads "key=<u32> " at *p. */
static int take_u32(const char **p, const char *key, uint32_t *out)
{
    size_t klen = strlen(key);
    if (strncmp(*p, key, klen) != 0 || (*p)[klen] != '=')
        return KVS_EINVAL;
    const char *s = *p + klen + 1;
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (end == s || *end != ' ' || v > UINT32_MAX)
        return KVS_EINVAL;
    *out = (uint32_t)v;
    *p = end + 1;
    return 0;
}

int identity_parse(const char *text, identity_t *out)
{
    if (!text || !out || strncmp(text, TEXT_TAG " ", sizeof(TEXT_TAG)) != 0)
        return KVS_EINVAL;
    const char *p = text + sizeof(TEXT_TAG);
    const char *sp = strchr(p, ' ');
    char dtype[16];
    if (!sp || (size_t)(sp - p) >= sizeof(dtype))
        return KVS_EINVAL;
    memcpy(dtype, p, (size_t)(sp - p));
    dtype[sp - p] = '\0';
    p = sp + 1;
    geometry_t g = {0};
    uint32_t planes, tp;
    if (geometry_dtype_parse(dtype, &g.dtype) != 0 || take_u32(&p, "layers", &g.layers) != 0 ||
        take_u32(&p, "kv_heads", &g.kv_heads) != 0 || take_u32(&p, "head_dim", &g.head_dim) != 0 ||
        take_u32(&p, "planes", &planes) != 0 || take_u32(&p, "lora", &g.kv_lora_rank) != 0 ||
        take_u32(&p, "rope", &g.rope_head_dim) != 0 ||
        take_u32(&p, "block_tokens", &g.block_tokens) != 0 || take_u32(&p, "tp", &tp) != 0)
        return KVS_EINVAL;
    if (strncmp(p, "revision=", 9) != 0)
        return KVS_EINVAL;
    p += 9;
    sp = strchr(p, ' ');
    char rev[IDENTITY_REVISION_MAX + 1];
    if (!sp || (size_t)(sp - p) > IDENTITY_REVISION_MAX)
        return KVS_EINVAL;
    memcpy(rev, p, (size_t)(sp - p));
    rev[sp - p] = '\0';
    p = sp + 1;
    if (strncmp(p, "model=", 6) != 0)
        return KVS_EINVAL;
    p += 6;
    identity_t id;
    int rc = identity_make(strcmp(p, "-") == 0 ? NULL : p, strcmp(rev, "-") == 0 ? NULL : rev, &g,
                           tp, &id);
    if (rc != 0 || planes != geometry_planes(&g))
        return KVS_EINVAL;
    *out = id;
    return 0;
}

uint64_t identity_hash(const identity_t *id)
{
    char text[IDENTITY_TEXT_MAX + 1];
    int n = identity_text(id, text, sizeof(text));
    if (n < 0)
        n = 0;
    if ((size_t)n > IDENTITY_TEXT_MAX)
        n = IDENTITY_TEXT_MAX;
    uint64_t h = XXH3_64bits(text, (size_t)n);
    return h ? h : 1;
}

bool identity_same_layout(const identity_t *a, const identity_t *b)
{
    const geometry_t *x = &a->geo, *y = &b->geo;
    return x->layers == y->layers && x->kv_heads == y->kv_heads && x->head_dim == y->head_dim &&
           x->dtype == y->dtype && x->block_tokens == y->block_tokens &&
           x->kv_lora_rank == y->kv_lora_rank && x->rope_head_dim == y->rope_head_dim &&
           a->tp_size == b->tp_size;
}

bool identity_equal(const identity_t *a, const identity_t *b)
{
    return identity_same_layout(a, b) && strcmp(a->model, b->model) == 0 &&
           strcmp(a->revision, b->revision) == 0;
}
