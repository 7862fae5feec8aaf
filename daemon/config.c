#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "geometry.h"
#include "kvshare_status.h"
#include "log.h"
#include "metrics_http.h"

typedef enum key_type {
    K_PATH,
    K_U32,
    K_SIZE,
    K_FRACTION,
    K_BOOL,
    K_BACKEND,
    K_MODEL,
    K_DTYPE,
    K_LOGLEVEL,
    K_ADDR,
    K_UIDS,
    K_GIDS,
    K_GROUP,
    K_EVICTION,
} key_type_t;

typedef struct key_def {
    const char *key;
    const char *flag;
    key_type_t type;
    uint64_t min, max; /* K_U32, K_SIZE */
} key_def_t;

/* Every global key, its flag and how its value is checked. */
static const key_def_t global_keys[] = {
    {"socket", "--socket", K_PATH, 0, 0},
    {"backend", "--backend", K_BACKEND, 0, 0},
    {"device", "--device", K_U32, 0, 1023},
    {"model", "--model", K_MODEL, 0, 0},
    {"layers", "--layers", K_U32, 1, 4096},
    {"kv_heads", "--kv-heads", K_U32, 1, 4096},
    {"head_dim", "--head-dim", K_U32, 1, 65536},
    {"dtype", "--dtype", K_DTYPE, 0, 0},
    {"block_tokens", "--block-tokens", K_U32, 1, 65536},
    {"pool_bytes", "--pool-bytes", K_SIZE, 1, UINT64_MAX},
    {"pool_blocks", "--pool-blocks", K_U32, 1, UINT32_MAX - 1},
    {"gpu_memory_utilization", "--gpu-memory-utilization", K_FRACTION, 0, 0},
    {"max_frame", "--max-frame", K_SIZE, 64, UINT32_MAX},
    {"max_output", "--max-output", K_SIZE, 4096, UINT64_MAX},
    {"max_sessions", "--max-sessions", K_U32, 1, 1000000},
    {"max_namespaces", "--max-namespaces", K_U32, 1, 65536},
    {"log_level", "--log-level", K_LOGLEVEL, 0, 0},
    {"metrics_listen", "--metrics-listen", K_ADDR, 0, 0},
    {"dynamic_namespaces", "--dynamic-namespaces", K_BOOL, 0, 0},
    {"session_max_pinned", "--session-max-pinned", K_U32, 0, UINT32_MAX},
    {"session_max_writing", "--session-max-writing", K_U32, 0, UINT32_MAX},
    {"socket_group", "--socket-group", K_GROUP, 0, 0},
    {"allow_uids", "--allow-uids", K_UIDS, 0, 0},
    {"allow_gids", "--allow-gids", K_GIDS, 0, 0},
    {"drain_timeout_ms", "--drain-timeout-ms", K_U32, 0, 600000},
    {"eviction", "--eviction", K_EVICTION, 0, 0},
};

static const key_def_t ns_keys[] = {
    {"quota", NULL, K_U32, 0, UINT32_MAX - 1},
    {"reserve", NULL, K_U32, 0, UINT32_MAX - 1},
    {"allow_uids", NULL, K_UIDS, 0, 0},
    {"allow_gids", NULL, K_GIDS, 0, 0},
};

#define N_GLOBAL (sizeof(global_keys) / sizeof(global_keys[0]))
#define N_NSKEYS (sizeof(ns_keys) / sizeof(ns_keys[0]))

typedef struct errs {
    char *buf;
    size_t len, cap;
    const char *path;
    int count;
} errs_t;

static void err_at(errs_t *e, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void err_at(errs_t *e, int line, const char *fmt, ...)
{
    va_list ap;
    e->count++;
    if (!e->buf || e->cap == 0 || e->len + 1 >= e->cap)
        return;
    int n =
        snprintf(e->buf + e->len, e->cap - e->len, "%s%s:%d: ", e->len ? "\n" : "", e->path, line);
    if (n < 0 || (size_t)n >= e->cap - e->len) {
        e->len = e->cap - 1;
        return;
    }
    e->len += (size_t)n;
    va_start(ap, fmt);
    n = vsnprintf(e->buf + e->len, e->cap - e->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= e->cap - e->len)
        e->len = e->cap - 1;
    else
        e->len += (size_t)n;
}

int config_parse_bool(const char *text, bool *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1"};
    static const char *const no[] = {"no", "false", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return KVS_EINVAL;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)s[0]))
        return KVS_EINVAL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return KVS_EINVAL;
    *out = v;
    return 0;
}

int config_parse_ids(const char *text, bool groups, uint32_t *ids, uint32_t *n)
{
    char buf[1024];
    uint32_t count = 0;
    if (!text || strlen(text) >= sizeof(buf))
        return KVS_EINVAL;
    snprintf(buf, sizeof(buf), "%s", text);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
        uint64_t v;
        if (count == CONFIG_MAX_IDS)
            return KVS_EINVAL;
        if (parse_u64(tok, &v) == 0) {
            if (v >= UINT32_MAX)
                return KVS_EINVAL;
        } else if (groups) {
            struct group *g = getgrnam(tok);
            if (!g)
                return KVS_EINVAL;
            v = g->gr_gid;
        } else {
            struct passwd *p = getpwnam(tok);
            if (!p)
                return KVS_EINVAL;
            v = p->pw_uid;
        }
        ids[count++] = (uint32_t)v;
    }
    *n = count;
    return 0;
}

bool config_acl_allows(const config_acl_t *acl, uint32_t uid, uint32_t gid)
{
    if (acl->n_uids == 0 && acl->n_gids == 0)
        return true;
    for (uint32_t i = 0; i < acl->n_uids; i++)
        if (acl->uids[i] == uid)
            return true;
    for (uint32_t i = 0; i < acl->n_gids; i++)
        if (acl->gids[i] == gid)
            return true;
    return false;
}

void config_acl_describe(const config_acl_t *acl, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    if (acl->n_uids == 0 && acl->n_gids == 0) {
        snprintf(buf, len, "anyone");
        return;
    }
    for (int pass = 0; pass < 2; pass++) {
        uint32_t n = pass ? acl->n_gids : acl->n_uids;
        const uint32_t *ids = pass ? acl->gids : acl->uids;
        if (n == 0)
            continue;
        used += (size_t)snprintf(buf + used, used < len ? len - used : 0, "%s%s ", used ? " " : "",
                                 pass ? "gids" : "uids");
        for (uint32_t i = 0; i < n && used < len; i++)
            used += (size_t)snprintf(buf + used, len - used, "%s%u", i ? "," : "", ids[i]);
        if (used >= len)
            return;
    }
}

/* Checks one value; on error the message goes to e at `line`. */
static int check_value(const key_def_t *k, const char *v, int line, errs_t *e)
{
    uint64_t n;
    switch (k->type) {
    case K_PATH:
        if (!v[0] || strlen(v) >= 108) {
            err_at(e, line, "%s: give a path of 1 to 107 bytes", k->key);
            return KVS_EINVAL;
        }
        return 0;
    case K_U32:
        if (parse_u64(v, &n) != 0 || n < k->min || n > k->max) {
            err_at(e, line, "%s = '%s': give a whole number from %llu to %llu", k->key, v,
                   (unsigned long long)k->min, (unsigned long long)k->max);
            return KVS_EINVAL;
        }
        return 0;
    case K_SIZE:
        if (geometry_parse_bytes(v, &n) != 0 || n < k->min || n > k->max) {
            err_at(e, line,
                   "%s = '%s': give a size such as 512MiB, 8GiB or 70GB (at least %llu "
                   "bytes)",
                   k->key, v, (unsigned long long)k->min);
            return KVS_EINVAL;
        }
        return 0;
    case K_FRACTION: {
        char *end;
        double d = strtod(v, &end);
        if (end == v || *end || !(d > 0 && d <= 1)) {
            err_at(e, line, "%s = '%s': give a fraction in (0, 1], e.g. 0.9", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_BOOL: {
        bool b;
        if (config_parse_bool(v, &b) != 0) {
            err_at(e, line, "%s = '%s': give yes or no", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_BACKEND: {
        backend_kind_t kind;
        if (backend_kind_parse(v, &kind) != 0) {
            err_at(e, line, "%s = '%s': give auto, host or cuda", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_MODEL: {
        geometry_t g;
        if (geometry_preset(v, &g) != 0) {
            err_at(e, line, "%s = '%s': unknown model preset (kvshared --help lists them)", k->key,
                   v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_DTYPE: {
        geometry_dtype_t d;
        if (geometry_dtype_parse(v, &d) != 0) {
            err_at(e, line, "%s = '%s': give fp32, fp16, bf16 or fp8", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_LOGLEVEL: {
        log_level_t l;
        if (log_level_parse(v, &l) != 0) {
            err_at(e, line, "%s = '%s': give error, warn, info or debug", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_ADDR: {
        char host[64];
        int port;
        if (metrics_http_parse_addr(v, host, sizeof(host), &port) != 0) {
            err_at(e, line,
                   "%s = '%s': give HOST:PORT with a numeric address, e.g. "
                   "127.0.0.1:9464",
                   k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_UIDS:
    case K_GIDS: {
        uint32_t ids[CONFIG_MAX_IDS], cnt;
        if (config_parse_ids(v, k->type == K_GIDS, ids, &cnt) != 0) {
            err_at(e, line,
                   "%s = '%s': give up to %d %s, by number or name, separated by commas "
                   "(a name must exist on this host)",
                   k->key, v, CONFIG_MAX_IDS, k->type == K_GIDS ? "group ids" : "user ids");
            return KVS_EINVAL;
        }
        return 0;
    }
    case K_EVICTION:
        if (strcmp(v, "lru") != 0 && strcmp(v, "freq") != 0) {
            err_at(e, line, "%s = '%s': give lru or freq", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    case K_GROUP: {
        uint32_t ids[CONFIG_MAX_IDS], cnt;
        if (config_parse_ids(v, true, ids, &cnt) != 0 || cnt != 1) {
            err_at(e, line, "%s = '%s': give one group, by name or number", k->key, v);
            return KVS_EINVAL;
        }
        return 0;
    }
    }
    return KVS_EINVAL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static bool ns_name_ok(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len >= CONFIG_NS_NAME_MAX)
        return false;
    for (const char *p = name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.')
            return false;
    return true;
}

const config_ns_t *config_find_ns(const config_t *c, const char *name)
{
    for (uint32_t i = 0; c && i < c->n_ns; i++)
        if (strcmp(c->ns[i].name, name) == 0)
            return &c->ns[i];
    return NULL;
}

void config_free(config_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->argc; i++)
        free(c->argv[i]);
    free(c->argv);
    free(c->ns);
    free(c);
}

static int push_arg(config_t *c, const char *s)
{
    char **a = realloc(c->argv, sizeof(char *) * (size_t)(c->argc + 1));
    if (!a)
        return KVS_ENOMEM;
    c->argv = a;
    c->argv[c->argc] = strdup(s);
    if (!c->argv[c->argc])
        return KVS_ENOMEM;
    c->argc++;
    return 0;
}

int config_load(const char *path, config_t **out, char *err, size_t errlen)
{
    errs_t e = {err, 0, errlen, path, 0};
    char raw[4096];
    int line = 0, rc = 0;
    bool seen[N_GLOBAL] = {false};
    bool ns_seen[N_NSKEYS] = {false};
    config_ns_t *cur = NULL;
    bool in_ns = false; /* past the first [namespace] header, even a broken one */

    if (err && errlen)
        err[0] = '\0';
    if (!path || !out)
        return KVS_EINVAL;
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: cannot read the config file: %s", path, strerror(errno));
        return KVS_EIO;
    }
    config_t *c = calloc(1, sizeof(*c));
    if (!c) {
        fclose(f);
        return KVS_ENOMEM;
    }
    while (fgets(raw, sizeof(raw), f)) {
        line++;
        if (!strchr(raw, '\n') && !feof(f)) {
            err_at(&e, line, "line longer than %zu bytes", sizeof(raw) - 2);
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n')
                ;
            continue;
        }
        char *s = trim(raw);
        if (!s[0] || s[0] == '#' || s[0] == ';')
            continue;
        if (s[0] == '[') {
            char name[128];
            in_ns = true;
            char *close = strchr(s, ']');
            if (!close || close[1] || strncmp(s, "[namespace ", 11) != 0 ||
                (size_t)(close - (s + 11)) >= sizeof(name)) {
                err_at(&e, line, "bad section header '%s': write [namespace NAME]", s);
                cur = NULL;
                continue;
            }
            /* The name is everything between "[namespace " and "]", so that
             * "[namespace a b]" is a bad name, not namespace "a". */
            memcpy(name, s + 11, (size_t)(close - (s + 11)));
            name[close - (s + 11)] = '\0';
            char *trimmed = trim(name);
            memmove(name, trimmed, strlen(trimmed) + 1);
            if (!ns_name_ok(name)) {
                err_at(&e, line,
                       "namespace name '%s': use 1 to 63 letters, digits, '-', '_' or '.'", name);
                cur = NULL;
                continue;
            }
            if (config_find_ns(c, name)) {
                err_at(&e, line, "namespace '%s' is declared twice (first at line %d)", name,
                       config_find_ns(c, name)->line);
                cur = NULL;
                continue;
            }
            if (c->n_ns == CONFIG_MAX_NS) {
                err_at(&e, line, "more than %d namespaces", CONFIG_MAX_NS);
                cur = NULL;
                continue;
            }
            config_ns_t *ns = realloc(c->ns, sizeof(*ns) * (c->n_ns + 1));
            if (!ns) {
                rc = KVS_ENOMEM;
                goto done;
            }
            c->ns = ns;
            cur = &c->ns[c->n_ns++];
            memset(cur, 0, sizeof(*cur));
            memcpy(cur->name, name, strlen(name) + 1); /* ns_name_ok: < 64 bytes */
            cur->line = line;
            memset(ns_seen, 0, sizeof(ns_seen));
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            err_at(&e, line, "'%s' is not 'key = value' nor a [namespace NAME] header", s);
            continue;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        /* A comment may follow a value after whitespace. */
        for (char *h = value; *h; h++) {
            if ((*h == '#' || *h == ';') && h > value && isspace((unsigned char)h[-1])) {
                *h = '\0';
                value = trim(value);
                break;
            }
        }
        size_t vlen = strlen(value);
        if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
            value[vlen - 1] = '\0';
            value++;
        }
        if (!value[0]) {
            err_at(&e, line, "%s has no value", key);
            continue;
        }
        const key_def_t *table = in_ns ? ns_keys : global_keys;
        size_t n_table = in_ns ? N_NSKEYS : N_GLOBAL;
        size_t k;
        for (k = 0; k < n_table; k++)
            if (strcmp(table[k].key, key) == 0)
                break;
        if (k == n_table) {
            bool is_global = false;
            for (size_t g = 0; g < N_GLOBAL; g++)
                is_global |= strcmp(global_keys[g].key, key) == 0;
            if (in_ns && is_global)
                err_at(&e, line,
                       "'%s' is a global key: put it before the first [namespace] section", key);
            else
                err_at(&e, line, "unknown key '%s'%s", key,
                       in_ns ? " in a namespace section (quota, reserve, allow_uids, allow_gids)"
                             : " (docs/OPERATING.md lists the keys)");
            continue;
        }
        bool *seen_k = in_ns ? &ns_seen[k] : &seen[k];
        if (*seen_k) {
            err_at(&e, line, "%s is set twice in this section", key);
            continue;
        }
        *seen_k = true;
        if (check_value(&table[k], value, line, &e) != 0)
            continue;
        if (!in_ns) {
            if (push_arg(c, table[k].flag) != 0 || push_arg(c, value) != 0) {
                rc = KVS_ENOMEM;
                goto done;
            }
            continue;
        }
        if (!cur)
            continue; /* a broken header: its error is already reported */
        if (strcmp(key, "quota") == 0)
            cur->quota = (uint32_t)strtoul(value, NULL, 10);
        else if (strcmp(key, "reserve") == 0)
            cur->reserve = (uint32_t)strtoul(value, NULL, 10);
        else if (strcmp(key, "allow_uids") == 0)
            config_parse_ids(value, false, cur->acl.uids, &cur->acl.n_uids);
        else
            config_parse_ids(value, true, cur->acl.gids, &cur->acl.n_gids);
    }
    if (ferror(f))
        err_at(&e, line, "read error");
    for (uint32_t i = 0; i < c->n_ns; i++) {
        if (c->ns[i].quota && c->ns[i].reserve > c->ns[i].quota)
            err_at(&e, c->ns[i].line,
                   "namespace '%s': reserve %u is above its quota %u: lower the reserve",
                   c->ns[i].name, c->ns[i].reserve, c->ns[i].quota);
    }
done:
    fclose(f);
    if (rc == 0 && e.count > 0)
        rc = KVS_EINVAL;
    if (rc != 0) {
        config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}
