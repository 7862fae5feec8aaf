/* SPDX-License-Identifier: Apache-2.0 */
/*
 * identity: whose KV a block holds.
 *
 * Tokens verify a prefix; the identity verifies what computed its KV: the
 * model (its name or path, and its revision where known), the element type,
 * the whole geometry and layout (layers, KV heads, head dim, K/V planes or
 * MLA's latent), tokens per block, and the parallel layout the bytes belong
 * to (the devices whose shards one block holds). Two blocks of equal tokens
 * and different identities are different blocks: a cache that served one
 * for the other would hand an engine KV it did not compute.
 *
 * The daemon holds one identity per namespace (namespaces.h): from the
 * config ([namespace] model_name / model_revision), from the daemon's own
 * --model, or from the first worker that declares one in Hello. Every tier
 * writes it (the disk file's records, the cluster's keys and values) and
 * checks it on every way back.
 *
 * One canonical text names an identity, and its hash (XXH3-64 of the text)
 * is what records and keys carry:
 *
 *     kvs-id1 bf16 layers=32 kv_heads=8 head_dim=128 planes=2 lora=0 rope=0
 *         block_tokens=16 tp=1 revision=<rev or -> model=<name or ->
 *
 * (one line; the model comes last and may hold spaces, the revision may
 * not). The text is what logs and error messages show, so a refusal names
 * both identities in words.
 */
#ifndef KVS_DAEMON_IDENTITY_H
#define KVS_DAEMON_IDENTITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "geometry.h"

#define IDENTITY_MODEL_MAX    255 /* bytes of a model name or path */
#define IDENTITY_REVISION_MAX 63  /* bytes of a revision (a tag or a commit) */
#define IDENTITY_TEXT_MAX     512 /* bytes of the canonical text, NUL excluded */

typedef struct identity {
    char model[IDENTITY_MODEL_MAX + 1];       /* "" : not known */
    char revision[IDENTITY_REVISION_MAX + 1]; /* "" : not known */
    geometry_t geo;   /* dtype, layers, heads, head dim or MLA, block_tokens */
    uint32_t tp_size; /* devices whose shards one block holds (>= 1) */
} identity_t;

/* Where a namespace's identity came from, from weakest to strongest. */
typedef enum identity_source {
    IDENTITY_DAEMON = 0,   /* the daemon's --model and geometry: no one said more */
    IDENTITY_DECLARED = 1, /* a worker declared it (Hello), or a restart found it declared */
    IDENTITY_CONFIG = 2,   /* the config file's [namespace] model_name / model_revision */
} identity_source_t;

/* "daemon", "declared", "config". */
const char *identity_source_name(identity_source_t src);

/* Whether name is a usable model name (1 .. IDENTITY_MODEL_MAX bytes, no
 * control character) and rev a usable revision (0 .. IDENTITY_REVISION_MAX
 * bytes, no space or control character). */
bool identity_model_valid(const char *name);
bool identity_revision_valid(const char *rev);

/* Fills *out from its parts (model and revision may be NULL or ""). Errors:
 * KVS_EINVAL (a part that is not valid; geo must pass geometry_validate,
 * tp_size >= 1). */
int identity_make(const char *model, const char *revision, const geometry_t *geo, uint32_t tp_size,
                  identity_t *out);

/* The canonical text (see above) into buf (always NUL-terminated when len >
 * 0). Returns its length, like snprintf. */
int identity_text(const identity_t *id, char *buf, size_t len);

/* Parses a canonical text back (a disk file's namespace table). Errors:
 * KVS_EINVAL (not a canonical text of this version). */
int identity_parse(const char *text, identity_t *out);

/* XXH3-64 of the canonical text; never 0 (0 means "no identity" in records
 * and keys). */
uint64_t identity_hash(const identity_t *id);

/* Whether a and b name the same identity. */
bool identity_equal(const identity_t *a, const identity_t *b);

/* The part of an identity that is the pool's layout (everything but the
 * model and revision) is the same in a and b. */
bool identity_same_layout(const identity_t *a, const identity_t *b);

#endif /* KVS_DAEMON_IDENTITY_H */
