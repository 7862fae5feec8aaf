/* SPDX-License-Identifier: Apache-2.0 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <netinet/in.h>
#include <uv.h>

#include "kvshare_status.h"
#include "nsname.h"
#include "settings.h"

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

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

void config_ns_init(config_ns_t *n)
{
    memset(n, 0, sizeof(*n));
    n->priority = RADIX_PRIO_DEFAULT;
    n->max_priority = CONFIG_PRIO_UNSET;
}

const config_ns_t *config_find_ns(const config_t *c, const char *name)
{
    for (uint32_t i = 0; c && i < c->n_ns; i++)
        if (strcmp(c->ns[i].name, name) == 0)
            return &c->ns[i];
    return NULL;
}

/* The field of a text key of a [namespace] section: a string the section
 * owns. */
static char **ns_text(config_ns_t *ns, const setting_t *row)
{
    return (char **)(void *)((char *)ns + row->offset);
}

void config_free(config_t *c)
{
    if (!c)
        return;
    for (uint32_t i = 0; i < c->n_ns; i++)
        for (size_t r = 0; r < settings_count; r++)
            if (settings_table[r].scope == SETTING_NS && settings_table[r].type == SETTING_TEXT)
                free(*ns_text(&c->ns[i], &settings_table[r]));
    for (uint32_t i = 0; i < c->n_entries; i++)
        free(c->entries[i].value);
    free(c->entries);
    free(c->ns);
    free(c);
}

int config_check_pool(const config_t *c, uint32_t num_blocks, char *err, size_t errlen)
{
    uint64_t reserved = 0;
    for (uint32_t i = 0; c && i < c->n_ns; i++) {
        const config_ns_t *n = &c->ns[i];
        if (n->quota > num_blocks || n->reserve > num_blocks) {
            snprintf(err, errlen,
                     "namespace '%s' (line %d): quota %u / reserve %u is more than the pool's %u "
                     "blocks",
                     n->name, n->line, n->quota, n->reserve, num_blocks);
            return KVS_EINVAL;
        }
        reserved += n->reserve;
    }
    if (reserved > num_blocks) {
        snprintf(err, errlen,
                 "the namespaces reserve %llu blocks in all, more than the pool's %u: lower "
                 "the reservations or grow the pool",
                 (unsigned long long)reserved, num_blocks);
        return KVS_EINVAL;
    }
    return 0;
}

static int add_entry(config_t *c, const setting_t *row, const char *value, int line)
{
    config_entry_t *e = realloc(c->entries, sizeof(*e) * (c->n_entries + 1));
    if (!e)
        return KVS_ENOMEM;
    c->entries = e;
    e[c->n_entries] = (config_entry_t){.setting = row, .value = strdup(value), .line = line};
    if (!e[c->n_entries].value)
        return KVS_ENOMEM;
    c->n_entries++;
    return 0;
}

/* Reads the whole file at path into a malloc'd, NUL-terminated buffer,
 * only if it is a regular file of at most CONFIG_MAX_BYTES. The open does
 * not wait (O_NONBLOCK: a FIFO with no writer opens at once) and what is not
 * a regular file is refused before a byte is read, so that neither
 * --check-config nor a SIGHUP reload can hang on /dev/zero, a FIFO or a
 * terminal. Errors: KVS_EIO (message in err), KVS_ENOMEM. */
static int read_file(const char *path, char **out, size_t *out_len, char *err, size_t errlen)
{
    struct stat sb;
    char *buf = NULL;
    size_t len = 0;
    int rc = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot read the config file: %s", path, strerror(errno));
        return KVS_EIO;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen,
                 "%s: not a regular file (a FIFO, a device or a directory): give "
                 "the path of a config file",
                 path);
        rc = KVS_EIO;
        goto done;
    }
    if (sb.st_size > CONFIG_MAX_BYTES) {
        snprintf(err, errlen, "%s: %lld bytes, more than a config file may hold (%u)", path,
                 (long long)sb.st_size, CONFIG_MAX_BYTES);
        rc = KVS_EIO;
        goto done;
    }
    /* One byte more than the bound: a file that grew since fstat is
     * refused, not read without end. */
    buf = malloc((size_t)CONFIG_MAX_BYTES + 2);
    if (!buf) {
        rc = KVS_ENOMEM;
        goto done;
    }
    while (len <= CONFIG_MAX_BYTES) {
        ssize_t got = read(fd, buf + len, (size_t)CONFIG_MAX_BYTES + 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(err, errlen, "%s: cannot read the config file: %s", path, strerror(errno));
            rc = KVS_EIO;
            goto done;
        }
        if (got == 0)
            break;
        len += (size_t)got;
    }
    if (len > CONFIG_MAX_BYTES) {
        snprintf(err, errlen, "%s: grew past %u bytes while being read", path, CONFIG_MAX_BYTES);
        rc = KVS_EIO;
        goto done;
    }
    buf[len] = '\0';
done:
    close(fd);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = len;
    return 0;
}

/* Copies the next line of text[*pos..len) into raw (at most rawlen - 1
 * bytes, the newline included when it fits) and moves *pos past the line.
 * Returns false at the end of the text; *too_long when the line did not
 * fit (its rest is skipped). */
static bool next_line(const char *text, size_t len, size_t *pos, char *raw, size_t rawlen,
                      bool *too_long)
{
    if (*pos >= len)
        return false;
    const char *start = text + *pos;
    const char *nl = memchr(start, '\n', len - *pos);
    size_t line_len = nl ? (size_t)(nl - start) + 1 : len - *pos;
    *pos += line_len;
    *too_long = line_len > rawlen - 1;
    if (*too_long)
        line_len = 0;
    memcpy(raw, start, line_len);
    raw[line_len] = '\0';
    return true;
}

int config_load(const char *path, config_t **out, char *err, size_t errlen)
{
    errs_t e = {err, 0, errlen, path, 0};
    char raw[4096];
    int line = 0, rc = 0;
    settings_mask_t seen = {{0}}, ns_seen = {{0}}; /* bit i: settings_table[i] was set */
    settings_t scratch;                            /* where global values are checked */
    config_ns_t *cur = NULL;
    bool in_ns = false; /* past the first [namespace] header, even a broken one */

    if (err && errlen)
        err[0] = '\0';
    if (!path || !out)
        return KVS_EINVAL;
    char *text = NULL;
    size_t text_len = 0, pos = 0;
    bool too_long;
    rc = read_file(path, &text, &text_len, err, errlen);
    if (rc != 0)
        return rc;
    config_t *c = calloc(1, sizeof(*c));
    if (!c) {
        free(text);
        return KVS_ENOMEM;
    }
    settings_init(&scratch);
    for (size_t at = pos; next_line(text, text_len, &pos, raw, sizeof(raw), &too_long); at = pos) {
        line++;
        if (too_long) {
            err_at(&e, line, "line longer than %zu bytes", sizeof(raw) - 2);
            continue;
        }
        /* A NUL would end the value there, silently: "6\0 4" read as 6. */
        if (memchr(text + at, '\0', pos - at)) {
            err_at(&e, line, "a NUL byte in the line (is this a text file?)");
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
            if (!nsname_valid(name)) {
                err_at(&e, line, "namespace name '%s': use %s", name, nsname_rule());
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
            config_ns_init(cur);
            memcpy(cur->name, name, strlen(name) + 1); /* nsname_valid: it fits */
            cur->line = line;
            ns_seen = (settings_mask_t){{0}};
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
        setting_scope_t scope = in_ns ? SETTING_NS : SETTING_GLOBAL;
        const setting_t *row = settings_find_key(scope, key);
        if (!row) {
            if (in_ns && settings_find_key(SETTING_GLOBAL, key))
                err_at(&e, line,
                       "'%s' is a global key: put it before the first [namespace] section", key);
            else
                err_at(&e, line, "unknown key '%s'%s", key,
                       in_ns ? " in a namespace section (quota, reserve, allow_uids, allow_gids, "
                               "hit_rate_target, tier, model_name, model_revision, lora_name, ...)"
                             : " (docs/OPERATING.md lists the keys)");
            continue;
        }
        size_t bit = (size_t)(row - settings_table);
        settings_mask_t *seen_k = in_ns ? &ns_seen : &seen;
        if (settings_mask_has(seen_k, bit)) {
            err_at(&e, line, "%s is set twice in this section", key);
            continue;
        }
        settings_mask_set(seen_k, bit);
        /* A broken [namespace] header: the values are still checked. */
        config_ns_t spare;
        char why[512];
        void *base = !in_ns ? (void *)&scratch : cur ? (void *)cur : (void *)&spare;
        if (settings_set(row, base, value, why, sizeof(why)) != 0) {
            err_at(&e, line, "%s = '%s': %s", key, value, why);
            continue;
        }
        if (!in_ns && add_entry(c, row, value, line) != 0) {
            rc = KVS_ENOMEM;
            goto done;
        }
        /* A text value points into this line: the section keeps a copy. */
        if (in_ns && cur && row->type == SETTING_TEXT && !(*ns_text(cur, row) = strdup(value))) {
            rc = KVS_ENOMEM;
            goto done;
        }
    }
    for (uint32_t i = 0; i < c->n_ns; i++) {
        if (c->ns[i].quota && c->ns[i].reserve > c->ns[i].quota)
            err_at(&e, c->ns[i].line,
                   "namespace '%s': reserve %u is above its quota %u: lower the reserve",
                   c->ns[i].name, c->ns[i].reserve, c->ns[i].quota);
    }
done:
    free(text);
    if (rc == 0 && e.count > 0)
        rc = KVS_EINVAL;
    if (rc != 0) {
        config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int config_parse_host_port(const char *listen, char *host, size_t hostlen, int *port)
{
    if (!listen || !host || !port)
        return KVS_EINVAL;
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || !colon[1])
        return KVS_EINVAL;
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return KVS_EINVAL;
        h++;
        hl -= 2;
    }
    if (hl >= hostlen)
        return KVS_EINVAL;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535)
        return KVS_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    if (uv_ip4_addr(host, *port, &a4) != 0 && uv_ip6_addr(host, *port, &a6) != 0)
        return KVS_EINVAL;
    return 0;
}
