/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config: kvshared's configuration file.
 *
 * Format: UTF-8 text, one setting per line.
 *
 *     # a comment (also ';'); blank lines are ignored
 *     key = value                 global settings first
 *     [namespace NAME]            then one section per namespace
 *     quota = 4096
 *
 * The keys are the rows of the settings table (settings.h): every global key
 * is also a flag (`pool_blocks = 4096` is `--pool-blocks 4096`), and each
 * value is checked by settings_set, the validator flags go through too.
 * config_load keeps the global settings as entries that settings_parse
 * applies before the command line's flags, so a flag overrides the file.
 * Values may be quoted ("..."). An error names the file and line.
 */
#ifndef KVS_DAEMON_CONFIG_H
#define KVS_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radix.h"

#define CONFIG_MAX_IDS 32  /* entries of one allow-list */
#define CONFIG_MAX_NS  256 /* namespaces declared in one file */
/* The largest config file read: 256 sections of a few keys take a few
 * KiB; anything near this bound is a wrong path, not a config. */
#define CONFIG_MAX_BYTES (1u << 20)

struct setting;

/* An allow-list of uids and gids: a peer is allowed when its uid is in uids
 * or its gid is in gids. Both empty: everyone is allowed. */
typedef struct config_acl {
    uint32_t n_uids, n_gids;
    uint32_t uids[CONFIG_MAX_IDS];
    uint32_t gids[CONFIG_MAX_IDS];
} config_acl_t;

/* A section's max_priority when it sets none: default_max_priority holds. */
#define CONFIG_PRIO_UNSET UINT32_MAX

typedef struct config_ns {
    char name[RADIX_NS_NAME_MAX + 1];
    uint32_t quota;    /* max cached blocks; 0: none */
    uint32_t reserve;  /* blocks guaranteed to it (radix_evict's rule) */
    uint32_t priority; /* retention priority of unhinted blocks (radix_hint) */
    uint32_t
        max_priority; /* the highest a hint may give; CONFIG_PRIO_UNSET: the daemon's default */
    config_acl_t acl;
    double hit_rate_target;           /* (0, 1]: designed for caching, alert below; 0: not set */
    char tier[RADIX_NS_NAME_MAX + 1]; /* service tier, for metrics by tier; "": none */
    const char *model_name;           /* KV events: the model routers key on; NULL: none (owned) */
    const char *lora_name;            /* KV events: the LoRA name; NULL: none (owned) */
    const char *model_revision;       /* identity: model_name's revision; NULL: none (owned) */
    bool shared;                      /* its blocks go to the cluster tier (cluster_store.h) */
    bool cluster_clear;               /* a Clear deletes its keys in the cluster too */
    int line;                         /* of its [namespace] header, for messages */
} config_ns_t;

/* One global setting of the file, already validated. */
typedef struct config_entry {
    const struct setting *setting; /* its row of the settings table */
    char *value;                   /* owned */
    int line;
} config_entry_t;

/* A namespace section with every key at its default. */
void config_ns_init(config_ns_t *n);

typedef struct config {
    config_entry_t *entries; /* the global section, in file order */
    uint32_t n_entries;
    config_ns_t *ns;
    uint32_t n_ns;
} config_t;

/* Reads and validates the file at path. Only a regular file of at most
 * CONFIG_MAX_BYTES is read, opened without waiting: a FIFO, a device
 * (/dev/zero) or a directory is refused at once. On success *out owns
 * everything (free with config_free). Errors: KVS_EINVAL with every problem
 * found, one per line "PATH:LINE: what is wrong", in err (truncated to
 * errlen); KVS_EIO (cannot read the file, not a regular file, too large:
 * message in err); KVS_ENOMEM. */
int config_load(const char *path, config_t **out, char *err, size_t errlen);

/* Accepts NULL. */
void config_free(config_t *c);

/* What start checks of the sections against a pool of num_blocks (also
 * what --check-config checks when the pool's size is known from the
 * settings): each quota and reservation at most the pool, the reservations
 * together at most the pool. Returns 0 or KVS_EINVAL (message in err). */
int config_check_pool(const config_t *c, uint32_t num_blocks, char *err, size_t errlen);

/* The namespace named `name`, or NULL. */
const config_ns_t *config_find_ns(const config_t *c, const char *name);

/* Parses a list "1000, alice, 0" of uids (gids when `groups`) by number or
 * name into ids[0..*n). Errors: KVS_EINVAL (unknown name, bad number, more
 * than CONFIG_MAX_IDS). */
int config_parse_ids(const char *text, bool groups, uint32_t *ids, uint32_t *n);

/* "yes/no/true/false/on/off/1/0" -> *out. Errors: KVS_EINVAL. */
int config_parse_bool(const char *text, bool *out);

/* Whether uid/gid pass the allow-list (an empty list passes everyone). */
bool config_acl_allows(const config_acl_t *acl, uint32_t uid, uint32_t gid);

/* Writes "uids 1000,1001 gids 27" or "anyone" into buf. */
void config_acl_describe(const config_acl_t *acl, char *buf, size_t len);

/* Parses "HOST:PORT" (an IPv4 address, or [IPv6]) into *port and the host
 * copied into host[hostlen] (metrics_listen). Returns 0 or KVS_EINVAL. */
int config_parse_host_port(const char *listen, char *host, size_t hostlen, int *port);

#endif /* KVS_DAEMON_CONFIG_H */
