/* SPDX-License-Identifier: Apache-2.0 */
/*
 * settings: every setting of kvshared, once.
 *
 * One table (settings_table in settings.c) holds, per setting, its config
 * key, its flag, its type and bounds, where its value goes, whether SIGHUP
 * applies it, and its help line. The rest is generated from the table:
 *
 *     settings_table --+--> getopt_long's option list       (settings_parse)
 *                      +--> kvshared --help                  (settings_usage)
 *                      +--> the keys of the config file      (config.c)
 *                      +--> --check-config                   (settings_parse)
 *                      +--> the effective-config log line    (settings_log)
 *                      +--> the tables of docs/OPERATING.md  (settings_markdown,
 *                      |                                      checked by a test)
 *                      `--> kvshared(8)'s options            (settings_man)
 *
 * Flags are config lines applied after the file (as Redis does): the file's
 * settings first, then the command line's in order, each through
 * settings_set, the one validator. A value the file refuses, a flag refuses
 * with the same reason. Flags may be abbreviated to any unambiguous prefix
 * (getopt_long), --config and --check-config included: `--conf x.conf` is
 * `--config x.conf`; an ambiguous prefix is refused.
 */
#ifndef KVS_DAEMON_SETTINGS_H
#define KVS_DAEMON_SETTINGS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "log.h"
#include "server.h"

#define SETTINGS_MAX_NS_FLAGS 64 /* --namespace flags on one command line */

typedef enum setting_type {
    SETTING_TEXT,      /* a string of min..max bytes, checked by `parse` if set */
    SETTING_U32,       /* a whole number in [min, max] */
    SETTING_SIZE,      /* a byte size ("512MiB", "70GB") in [min, max] */
    SETTING_FRACTION,  /* a number in (0, 1] */
    SETTING_BOOL,      /* yes/no, true/false, on/off, 1/0 */
    SETTING_CHOICE,    /* one of the names `name` lists; stored as an int (enum) */
    SETTING_UIDS,      /* up to CONFIG_MAX_IDS users: the uids of a config_acl_t */
    SETTING_GIDS,      /* up to CONFIG_MAX_IDS groups: the gids of a config_acl_t */
    SETTING_GROUP,     /* one group, by name or number: a uint32_t gid */
    SETTING_NAMESPACE, /* NAME[:QUOTA[:RESERVE]], repeatable: settings_t.ns */
    SETTING_SWITCH,    /* a flag without a value (--help): a bool */
    SETTING_NAME,      /* a name under the namespace-name rule, copied into a char[width] */
} setting_type_t;

typedef enum setting_scope {
    SETTING_GLOBAL, /* a global key of the file and/or a flag; value in settings_t */
    SETTING_NS,     /* a key of a [namespace NAME] section; value in config_ns_t */
} setting_scope_t;

typedef struct setting {
    const char *key;  /* config key; NULL: a flag only */
    const char *flag; /* long flag without "--"; NULL: a file key only */
    setting_scope_t scope;
    setting_type_t type;
    const char *arg;   /* the value in --help: "N", "SIZE", "PATH" */
    uint64_t min, max; /* bounds of a number, or of a text's length in bytes */
    /* SETTING_CHOICE: name -> value; SETTING_TEXT: a check (out unused).
     * Returns 0 or KVS_EINVAL. */
    int (*parse)(const char *text, int *out);
    /* The accepted names by value, NULL past the last: SETTING_CHOICE, and
     * SETTING_TEXT with a fixed list (model presets). */
    const char *(*name)(int i);
    const char *expect;  /* SETTING_TEXT: what to give, e.g. "HOST:PORT ..." */
    const char *example; /* a valid value (docs, tests); NULL: the default */
    size_t offset;       /* of the value in settings_t or config_ns_t */
    size_t width;        /* its size in bytes */
    const char *zero;    /* what a zero or empty value means ("no limit") */
    /* The initial value: a number, a switch, a choice (0 when it is 0), or
     * a text; every default is written here, and settings_init (so
     * server_config_init) applies it. */
    uint64_t init;
    const char *init_text;
    const char *deflt; /* the default in words, when it is not the initial value */
    bool reload;       /* SIGHUP applies a change; else a restart does */
    const char *help;  /* one line: what it does */
} setting_t;

extern const setting_t settings_table[];
extern const size_t settings_count;

/* A namespace declared by a --namespace flag. */
/* One bit per row of settings_table (SETTINGS_MAX_ROWS of them). */
#define SETTINGS_MAX_ROWS 128
typedef struct settings_mask {
    uint64_t w[SETTINGS_MAX_ROWS / 64];
} settings_mask_t;

/* Sets / tests bit i. */
static inline void settings_mask_set(settings_mask_t *m, size_t i)
{
    m->w[i / 64] |= 1ull << (i % 64);
}

static inline bool settings_mask_has(const settings_mask_t *m, size_t i)
{
    return (m->w[i / 64] >> (i % 64)) & 1;
}

typedef struct settings_ns {
    char name[RADIX_NS_NAME_MAX + 1];
    uint32_t quota, reserve;
} settings_ns_t;

/* Everything the command line and the file decide. */
typedef struct settings {
    server_config_t server; /* what server_open takes */
    const char *model;      /* geometry preset */
    geometry_t geometry;    /* fields given by hand; settings_finish merges */
    uint64_t pool_bytes;
    double gpu_memory_utilization;
    uint32_t loop_rt_priority; /* 0: the loop thread at normal priority */
    log_level_t log_level;
    const char *config_path;
    const char *check_path;
    bool help, version;
    settings_ns_t ns[SETTINGS_MAX_NS_FLAGS];
    uint32_t n_ns;
    settings_mask_t given; /* bit i: settings_table[i] was set by the file or a flag */
    config_t *conf;        /* the config file (values point into it); owned */
    int file_errors;       /* errors found in the file (settings_parse) */
    char default_socket[PATH_MAX];
} settings_t;

/* Fills st with the defaults. */
void settings_init(settings_t *st);

/* Frees what st owns (the config file). st stays initialised. */
void settings_free(settings_t *st);

/* The row of a config key in `scope`, or NULL. */
const setting_t *settings_find_key(setting_scope_t scope, const char *key);

/* The one validator: checks `value` against row's type and bounds and stores
 * it into base (a settings_t for SETTING_GLOBAL, a config_ns_t for
 * SETTING_NS). value must outlive base when the row is SETTING_TEXT.
 * Errors: KVS_EINVAL with the reason ("give a whole number from 1 to 1024")
 * in why; the caller adds where the value came from. */
int settings_set(const setting_t *row, void *base, const char *value, char *why, size_t whylen);

/* After the last settings_set: merges the geometry preset with the fields
 * given by hand, picks the pool size and the default socket path, and checks
 * settings against each other (pool_bytes with pool_blocks). Errors:
 * KVS_EINVAL (message in err). */
int settings_finish(settings_t *st, char *err, size_t errlen);

/* kvshared's command line: the flags, then the file named by --config, then
 * the flags applied over it, then settings_finish. Prints --help, --version,
 * the --check-config verdict and every error itself (stdout, stderr).
 * Returns true when the daemon should start; otherwise *status is the exit
 * status: 0 (help, version, a valid --check-config), 1 (--check-config found
 * errors), 2 (bad flags or a bad config file at start). */
bool settings_parse(settings_t *st, int argc, char **argv, int *status);

/* kvshared --help. */
void settings_usage(FILE *f);

/* Logs the settings in force, "config: key value, ...", once at start. */
void settings_log(const settings_t *st);

/* Writes row's value in base as the file would take it ("16MiB", "yes"). */
void settings_format(const setting_t *row, const void *base, char *buf, size_t len);

/* The Markdown tables of docs/OPERATING.md: every flag and global key, then
 * the keys of a [namespace] section. */
void settings_markdown(FILE *f);

/* The OPTIONS and CONFIGURATION FILE sections of kvshared(8), in roff: every
 * flag, the global keys without a flag, the keys of a [namespace] section.
 * man/manpage.c writes the rest of the page around them. */
void settings_man(FILE *f);

#endif /* KVS_DAEMON_SETTINGS_H */
