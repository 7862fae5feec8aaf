/* SPDX-License-Identifier: Apache-2.0 */
#include "namespaces.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errbuf.h"
#include "inflight.h"
#include "kvshare_status.h"
#include "log.h"
#include "nsname.h"
#include "server.h"
#include "session.h"

static int namespaces_alloc(server_t *srv)
{
    if (srv->ns.tenants)
        return 0;
    srv->ns.tenants = calloc(srv->cfg.max_namespaces, sizeof(*srv->ns.tenants));
    if (!srv->ns.tenants)
        return KVS_ENOMEM;
    srv->ns.n_tenants = srv->cfg.max_namespaces;
    return 0;
}

int namespaces_declare(server_t *srv, const char *name, char *err, size_t errlen)
{
    uint32_t id;
    if (radix_ns_find(srv->index, name, &id) != 0) {
        snprintf(err, errlen, "namespace '%s' does not exist", name);
        return KVS_ENONS;
    }
    if (namespaces_alloc(srv) != 0) {
        snprintf(err, errlen, "out of memory for the namespace table");
        return KVS_ENOMEM;
    }
    if (id < srv->ns.n_tenants)
        srv->ns.tenants[id].declared = srv->ns.tenants[id].by_flag = true;
    return 0;
}

static int check(const server_t *srv, const config_t *conf, char *err, size_t errlen)
{
    uint32_t new_ns = 0, id;
    int rc = config_check_pool(conf, srv->num_blocks, err, errlen);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; conf && i < conf->n_ns; i++)
        if (radix_ns_find(srv->index, conf->ns[i].name, &id) != 0)
            new_ns++;
    if (radix_ns_count(srv->index) + new_ns > srv->cfg.max_namespaces) {
        snprintf(err, errlen, "%u namespaces would exceed max_namespaces (%u)",
                 radix_ns_count(srv->index) + new_ns, srv->cfg.max_namespaces);
        return KVS_EINVAL;
    }
    return 0;
}

int namespaces_apply(server_t *srv, config_t *conf, char *err, size_t errlen)
{
    /* Room for new sections first: unused dynamic namespaces would be
     * reclaimed by the next creation anyway. */
    uint32_t new_ns = 0, id;
    for (uint32_t i = 0; conf && i < conf->n_ns; i++)
        if (radix_ns_find(srv->index, conf->ns[i].name, &id) != 0)
            new_ns++;
    if (radix_ns_count(srv->index) + new_ns > srv->cfg.max_namespaces)
        namespaces_reclaim(srv);
    int rc = check(srv, conf, err, errlen);
    if (rc != 0)
        return rc;
    if (namespaces_alloc(srv) != 0)
        return KVS_ENOMEM;
    /* Every namespace first loses what the file gave it; the file (or a
     * --namespace flag) gives it back. */
    for (uint32_t i = 0; i < srv->ns.n_tenants; i++) {
        bool by_flag = srv->ns.tenants[i].by_flag;
        memset(&srv->ns.tenants[i], 0, sizeof(srv->ns.tenants[i]));
        srv->ns.tenants[i].declared = srv->ns.tenants[i].by_flag = by_flag;
    }
    srv->ns.any_acl = false;
    for (uint32_t i = 0; conf && i < conf->n_ns; i++) {
        const config_ns_t *n = &conf->ns[i];
        uint32_t id;
        if (radix_ns_find(srv->index, n->name, &id) == 0 && id < srv->ns.n_tenants &&
            srv->ns.tenants[id].by_flag) {
            /* --namespace overrides the file's limits, at start and on reload. */
        } else if (radix_ns_find(srv->index, n->name, &id) == 0) {
            radix_ns_stats_t before;
            radix_ns_stats(srv->index, id, &before);
            radix_ns_set_limits(srv->index, id, n->quota, n->reserve);
            if (before.quota != n->quota || before.reserve != n->reserve)
                LOG_INFO("namespace '%s': quota %u -> %u, reserve %u -> %u", n->name, before.quota,
                         n->quota, before.reserve, n->reserve);
        } else {
            rc = radix_ns_create(srv->index, n->name, namespaces_seed(n->name), n->quota,
                                 n->reserve, &id);
            if (rc != 0) {
                snprintf(err, errlen, "cannot create namespace '%s': %s", n->name,
                         kvs_status_text(rc));
                return rc;
            }
        }
        radix_ns_set_priority(srv->index, id, n->priority,
                              n->max_priority == CONFIG_PRIO_UNSET ? srv->cfg.default_max_priority
                                                                   : n->max_priority);
        if (id < srv->ns.n_tenants) {
            srv->ns.tenants[id].declared = true;
            srv->ns.tenants[id].acl = n->acl;
            if (n->acl.n_uids || n->acl.n_gids)
                srv->ns.any_acl = true;
        }
    }
    /* A namespace dropped from the file keeps its cache but loses its
     * limits: it is no longer the operator's to protect. */
    for (uint32_t id = 0; id < radix_ns_id_end(srv->index) && id < srv->ns.n_tenants; id++) {
        radix_ns_stats_t st;
        if (srv->ns.tenants[id].declared || radix_ns_stats(srv->index, id, &st) != 0)
            continue;
        if (srv->ns.conf && config_find_ns(srv->ns.conf, radix_ns_name(srv->index, id)) &&
            (st.quota || st.reserve)) {
            radix_ns_set_limits(srv->index, id, 0, 0);
            radix_ns_set_priority(srv->index, id, RADIX_PRIO_DEFAULT,
                                  srv->cfg.default_max_priority);
            LOG_INFO("namespace '%s' is no longer declared: quota and reserve removed",
                     radix_ns_name(srv->index, id));
        }
    }
    config_free(srv->ns.conf);
    srv->ns.conf = conf;
    return 0;
}

void namespaces_reload(server_t *srv)
{
    char err[2048];
    config_t *conf = NULL;
    if (!srv->cfg.config_path) {
        LOG_INFO("SIGHUP: no config file to reload (start with --config FILE)");
        return;
    }
    int rc = config_load(srv->cfg.config_path, &conf, err, sizeof(err));
    if (rc == 0)
        rc = namespaces_apply(srv, conf, err, sizeof(err));
    if (rc != 0) {
        if (conf && conf != srv->ns.conf)
            config_free(conf);
        srv->metrics.config_reload_errors++;
        LOG_ERROR("SIGHUP: %s not reloaded, the running configuration stays: %s",
                  srv->cfg.config_path, err);
        return;
    }
    srv->metrics.config_reloads++;
    LOG_INFO("SIGHUP: reloaded namespaces from %s (other keys take effect at restart)",
             srv->cfg.config_path);
    namespaces_log(srv);
}

uint32_t namespaces_reclaim(server_t *srv)
{
    uint32_t n = 0;
    for (uint32_t id = 0; id < radix_ns_id_end(srv->index); id++) {
        radix_ns_stats_t st;
        if (radix_ns_stats(srv->index, id, &st) != 0 || st.cached_blocks > 0 ||
            (id < srv->ns.n_tenants && srv->ns.tenants[id].declared) || inflight_ns_busy(srv, id))
            continue;
        if (radix_ns_delete(srv->index, id) != 0)
            continue;
        n++;
        if (srv->ns.creator && id < srv->cfg.max_namespaces && srv->ns.creator[id]) {
            srv->ns.creator[id]->ns_created--;
            srv->ns.creator[id] = NULL;
        }
        /* The next namespace with this id resolves its own topic. */
        if (srv->ns.ev_resolved && id < srv->cfg.max_namespaces)
            srv->ns.ev_resolved[id] = false;
        if (srv->ns.ident_resolved && id < srv->cfg.max_namespaces)
            srv->ns.ident_resolved[id] = false;
    }
    srv->metrics.namespaces_reclaimed += n;
    srv->ns.reclaimed_unlogged += n;
    uint64_t now = uv_now(srv->loop);
    if (srv->ns.reclaimed_unlogged &&
        (srv->ns.reclaim_log_ms == 0 || now - srv->ns.reclaim_log_ms >= 1000)) {
        LOG_INFO("namespace table full (max_namespaces %u): reclaimed %llu dynamic namespace(s) "
                 "that held nothing",
                 srv->cfg.max_namespaces, (unsigned long long)srv->ns.reclaimed_unlogged);
        srv->ns.reclaim_log_ms = now;
        srv->ns.reclaimed_unlogged = 0;
    }
    return n;
}

int namespaces_created(session_t *s, uint32_t ns)
{
    server_t *srv = s->srv;
    if (ns >= srv->cfg.max_namespaces)
        return 0;
    if (!srv->ns.creator) {
        srv->ns.creator = calloc(srv->cfg.max_namespaces, sizeof(*srv->ns.creator));
        if (!srv->ns.creator)
            return KVS_ENOMEM;
    }
    srv->ns.creator[ns] = s;
    s->ns_created++;
    return 0;
}

void namespaces_session_gone(session_t *s)
{
    server_t *srv = s->srv;
    for (uint32_t id = 0; s->ns_created > 0 && srv->ns.creator && id < srv->cfg.max_namespaces;
         id++) {
        if (srv->ns.creator[id] == s) {
            srv->ns.creator[id] = NULL;
            s->ns_created--;
        }
    }
}

void namespaces_free(server_t *srv)
{
    free(srv->ns.daemon_ident);
    free(srv->ns.idents);
    free(srv->ns.ident_resolved);
    srv->ns.daemon_ident = NULL;
    srv->ns.idents = NULL;
    srv->ns.ident_resolved = NULL;
    free(srv->ns.creator);
    srv->ns.creator = NULL;
    free(srv->ns.tenants);
    srv->ns.tenants = NULL;
    srv->ns.n_tenants = 0;
    config_free(srv->ns.conf);
    srv->ns.conf = NULL;
}

bool namespaces_allowed(const session_t *s, uint32_t ns)
{
    const server_t *srv = s->srv;
    if (!srv->ns.any_acl || ns >= srv->ns.n_tenants || !s->peer.known)
        return true;
    return config_acl_allows(&srv->ns.tenants[ns].acl, s->peer.uid, s->peer.gid);
}

/* An allow-list that names someone admits the peer (an empty one admits
 * everyone to use a namespace, but names no owner). */
static bool acl_names(const config_acl_t *acl, const session_t *s)
{
    return (acl->n_uids || acl->n_gids) && config_acl_allows(acl, s->peer.uid, s->peer.gid);
}

bool namespaces_may_clear(const session_t *s, uint32_t ns)
{
    const server_t *srv = s->srv;
    if (!s->peer.known || s->peer.uid == 0 || acl_names(&srv->cfg.clear_acl, s))
        return true;
    return ns < srv->ns.n_tenants && acl_names(&srv->ns.tenants[ns].acl, s);
}

bool namespaces_usable(const server_t *srv, uint32_t ns)
{
    if (srv->cfg.dynamic_namespaces)
        return true;
    return ns < srv->ns.n_tenants && srv->ns.tenants[ns].declared;
}

void namespaces_log(const server_t *srv)
{
    for (uint32_t i = 0; srv->ns.conf && i < srv->ns.conf->n_ns; i++) {
        const config_ns_t *n = &srv->ns.conf->ns[i];
        char acl[256];
        config_acl_describe(&n->acl, acl, sizeof(acl));
        LOG_INFO("config: namespace '%s': quota %u%s, reserve %u, allowed %s", n->name, n->quota,
                 n->quota ? "" : " (none)", n->reserve, acl);
    }
}

/* --- names, seeds, creation, resolution --- */

uint64_t namespaces_seed(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++) {
        h ^= (uint8_t)*p;
        h *= 0x100000001b3ull;
    }
    return h;
}

int namespaces_create(server_t *s, const char *name, uint32_t quota, uint32_t reserve, char *err,
                      size_t errlen)
{
    uint32_t ns;
    if (!s || !name)
        return KVS_EINVAL;
    if ((quota && reserve > quota) || reserve > s->num_blocks) {
        snprintf(err, errlen,
                 "namespace '%s': a reservation of %u blocks must not exceed its quota (%u) "
                 "nor the pool (%u blocks)",
                 name, reserve, quota, s->num_blocks);
        return KVS_EINVAL;
    }
    int rc = radix_ns_create(s->index, name, namespaces_seed(name), quota, reserve, &ns);
    if (rc != 0) {
        snprintf(err, errlen, "namespace '%s': %s%s%s", name, kvs_status_text(rc),
                 rc == KVS_EINVAL ? ": names are " : "", rc == KVS_EINVAL ? nsname_rule() : "");
        return rc;
    }
    radix_ns_set_priority(s->index, ns, RADIX_PRIO_DEFAULT, s->cfg.default_max_priority);
    LOG_INFO("namespace '%s': quota %u blocks%s, reserve %u", name, quota, quota ? "" : " (none)",
             reserve);
    return 0;
}

const events_stream_t *namespaces_events_stream(server_t *s, uint32_t ns)
{
    static const events_stream_t off = {.on = false};
    if (!s->events || ns >= s->cfg.max_namespaces)
        return &off;
    if (!s->ns.ev_resolved[ns]) {
        const char *name = radix_ns_name(s->index, ns);
        const config_ns_t *sec = name ? config_find_ns(s->ns.conf, name) : NULL;
        const char *model = sec ? sec->model_name : NULL;
        if (!sec && name && strcmp(name, SERVER_DEFAULT_NS) == 0)
            model = s->cfg.events.default_model;
        if (events_stream_init(&s->cfg.events, model, sec ? sec->lora_name : NULL,
                               &s->ns.ev_streams[ns]) != 0)
            LOG_WARN("kv events: namespace '%s' publishes nothing: its topic would exceed %d "
                     "bytes",
                     name, EVENTS_TOPIC_MAX);
        s->ns.ev_resolved[ns] = true;
    }
    return &s->ns.ev_streams[ns];
}

/* A namespace not created: logged at most once a second, with a count. */
static void ns_refused(server_t *srv, const char *why)
{
    uint64_t now = uv_now(srv->loop);
    srv->ns.refused_unlogged++;
    if (srv->ns.refuse_log_ms == 0 || now - srv->ns.refuse_log_ms >= 1000) {
        LOG_WARN("refused to create %llu namespace(s): %s",
                 (unsigned long long)srv->ns.refused_unlogged, why);
        srv->ns.refuse_log_ms = now;
        srv->ns.refused_unlogged = 0;
    }
}

int namespaces_resolve(session_t *s, const char *name, bool create, uint32_t *ns, char *msg,
                       size_t msglen)
{
    server_t *srv = s->srv;
    if (!name || !name[0])
        name = SERVER_DEFAULT_NS;
    size_t len = strlen(name);
    if (len > RADIX_NS_NAME_MAX)
        return errbuf_set(msg, msglen, KVS_EINVAL,
                          "namespace name of %zu bytes is too long (%d at most)", len,
                          RADIX_NS_NAME_MAX);
    /* A name in the table passed the rule when it was made: the rule is
     * checked only for one that is not (the lookup is the common case). */
    int rc = radix_ns_find(srv->index, name, ns);
    if (rc != 0 && !nsname_valid(name)) {
        char shown[4 * RADIX_NS_NAME_MAX + 1];
        return errbuf_set(msg, msglen, KVS_EINVAL, "namespace name '%s': use %s",
                          log_escape(name, shown, sizeof(shown)), nsname_rule());
    }
    if (rc == 0 && !namespaces_usable(srv, *ns))
        rc = KVS_ENONS;
    if (rc == 0 && !namespaces_allowed(s, *ns)) {
        srv->metrics.namespace_denied++;
        return errbuf_set(msg, msglen, KVS_EDENIED,
                          "permission denied: namespace '%s' does not allow uid %u / gid %u "
                          "(allow_uids / allow_gids of its [namespace] section)",
                          name, s->peer.uid, s->peer.gid);
    }
    if (rc == 0)
        return namespaces_identity_check(s, *ns, msg, msglen);
    if (!srv->cfg.dynamic_namespaces)
        return errbuf_set(
            msg, msglen, KVS_ENONS,
            "unknown namespace '%s': this kvshared serves only the namespaces its config "
            "declares; add a [namespace %s] section (then SIGHUP) or use a declared one",
            name, name);
    if (!create)
        return errbuf_set(msg, msglen, KVS_ENONS,
                          "unknown namespace '%s'; `kvshare stats` lists the namespaces in use",
                          name);
    uint32_t limit = srv->cfg.session_max_namespaces;
    if (limit && s->ns_created >= limit) {
        srv->metrics.namespace_session_refusals++;
        ns_refused(srv, "a connection reached session_max_namespaces");
        return errbuf_set(msg, msglen, KVS_ELIMIT,
                          "cannot create namespace '%s': this connection already created %u "
                          "namespaces that still exist (session_max_namespaces); reuse one of them",
                          name, limit);
    }
    if (radix_ns_count(srv->index) >= srv->cfg.max_namespaces && namespaces_reclaim(srv) == 0) {
        srv->metrics.namespace_table_refusals++;
        ns_refused(srv, "the namespace table is full of declared or used namespaces");
        return errbuf_set(msg, msglen, KVS_ELIMIT,
                          "cannot create namespace '%s': kvshared already has %u namespaces (the "
                          "limit, max_namespaces), each declared or holding blocks; reuse one",
                          name, srv->cfg.max_namespaces);
    }
    rc = radix_ns_create(srv->index, name, namespaces_seed(name), 0, 0, ns);
    if (rc == 0) /* O(1): the namespace is empty */
        radix_ns_set_priority(srv->index, *ns, RADIX_PRIO_DEFAULT, srv->cfg.default_max_priority);
    if (rc == 0 && namespaces_created(s, *ns) != 0) {
        radix_ns_delete(srv->index, *ns);
        rc = KVS_ENOMEM;
    }
    if (rc != 0)
        return errbuf_set(msg, msglen, rc, "cannot create namespace '%s': %s", name,
                          kvs_status_text(rc));
    if (srv->ns.ident_resolved && *ns < srv->cfg.max_namespaces)
        srv->ns.ident_resolved[*ns] = false; /* a reused id resolves its own */
    LOG_DEBUG("namespace '%s' created (id %u)", name, *ns);
    return namespaces_identity_check(s, *ns, msg, msglen);
}

/* --- model identity --- */

int namespaces_identity_open(server_t *srv, char *err, size_t errlen)
{
    const server_config_t *cfg = &srv->cfg;
    srv->ns.daemon_ident = calloc(1, sizeof(*srv->ns.daemon_ident));
    srv->ns.idents = calloc(cfg->max_namespaces, sizeof(*srv->ns.idents));
    srv->ns.ident_resolved = calloc(cfg->max_namespaces, sizeof(*srv->ns.ident_resolved));
    if (!srv->ns.daemon_ident || !srv->ns.idents || !srv->ns.ident_resolved) {
        snprintf(err, errlen, "out of memory for the namespaces' model identities");
        return KVS_ENOMEM;
    }
    ns_identity_t *d = srv->ns.daemon_ident;
    if (identity_make(cfg->model, cfg->model_revision, &srv->geo,
                      srv->n_devices ? srv->n_devices : 1, &d->id) != 0) {
        snprintf(err, errlen, "model '%s': not a usable model identity (%s)",
                 cfg->model ? cfg->model : "", "a name without control characters");
        return KVS_EINVAL;
    }
    d->hash = identity_hash(&d->id);
    d->source = IDENTITY_DAEMON;
    identity_text(&d->id, d->text, sizeof(d->text));
    LOG_INFO("model identity: %s", d->text);
    return 0;
}

static void identity_set(ns_identity_t *ni, const identity_t *id, identity_source_t src)
{
    ni->id = *id;
    ni->hash = identity_hash(id);
    ni->source = src;
    identity_text(id, ni->text, sizeof(ni->text));
}

const ns_identity_t *namespaces_daemon_identity(server_t *srv)
{
    return srv->ns.daemon_ident;
}

const ns_identity_t *namespaces_identity(server_t *srv, uint32_t ns)
{
    if (ns >= srv->cfg.max_namespaces)
        return srv->ns.daemon_ident;
    ns_identity_t *ni = &srv->ns.idents[ns];
    if (srv->ns.ident_resolved[ns])
        return ni;
    /* The config's section names the model (and revision) of its blocks;
     * the pool's layout is the daemon's. A name the identity refuses was
     * refused by the config's own check already. */
    const char *name = radix_ns_name(srv->index, ns);
    const config_ns_t *sec = name ? config_find_ns(srv->ns.conf, name) : NULL;
    identity_t id = srv->ns.daemon_ident->id;
    if (sec && sec->model_name &&
        identity_make(sec->model_name, sec->model_revision, &id.geo, id.tp_size, &id) == 0)
        identity_set(ni, &id, IDENTITY_CONFIG);
    else
        *ni = *srv->ns.daemon_ident;
    srv->ns.ident_resolved[ns] = true;
    return ni;
}

/* Whether ns holds a block in any tier. */
static bool ns_holds_blocks(server_t *srv, uint32_t ns)
{
    radix_ns_stats_t st;
    if (radix_ns_stats(srv->index, ns, &st) != 0)
        return false;
    return st.cached_blocks > 0 || st.tier2_blocks > 0 || st.tier3_blocks > 0;
}

int namespaces_identity_declare(server_t *srv, uint32_t ns, const identity_t *id,
                                identity_source_t src, char *msg, size_t msglen)
{
    if (ns >= srv->cfg.max_namespaces) /* no table entry: never bind another's */
        return errbuf_set(msg, msglen, KVS_EINTERNAL,
                          "namespace id %u is past max_namespaces (%u): no identity to bind", ns,
                          srv->cfg.max_namespaces);
    const ns_identity_t *cur = namespaces_identity(srv, ns);
    ns_identity_t *ni = &srv->ns.idents[ns];
    const char *name = radix_ns_name(srv->index, ns);
    char text[IDENTITY_TEXT_MAX + 1];
    identity_text(id, text, sizeof(text));
    if (!identity_same_layout(id, &srv->ns.daemon_ident->id)) {
        srv->metrics.identity_refusals++;
        return errbuf_set(msg, msglen, KVS_EINVAL,
                          "model identity '%s' does not fit this kvshared's pool, whose blocks "
                          "are '%s': its KV would be read with another layout; start kvshared "
                          "with this model's geometry, or give the worker the pool's",
                          text, srv->ns.daemon_ident->text);
    }
    if (identity_equal(id, &cur->id)) {
        if (cur->source < src)
            ni->source = src;
        return 0;
    }
    if (cur->source == IDENTITY_DAEMON && !ns_holds_blocks(srv, ns)) {
        identity_set(ni, id, src);
        LOG_INFO("namespace '%s': model identity %s (%s)", name ? name : "?", ni->text,
                 identity_source_name(src));
        return 0;
    }
    srv->metrics.identity_refusals++;
    return errbuf_set(msg, msglen, KVS_EIDENTITY,
                      "namespace '%s' holds the KV of '%s' (%s%s), not of '%s': its blocks would "
                      "be another model's; give this model a namespace of its own (the engine "
                      "plug-ins derive one from the model), or name this one's model in its "
                      "[namespace] section",
                      name ? name : "?", cur->text, identity_source_name(cur->source),
                      cur->source == IDENTITY_DAEMON ? ", and it holds blocks" : "", text);
}

int namespaces_identity_check(session_t *s, uint32_t ns, char *msg, size_t msglen)
{
    server_t *srv = s->srv;
    if (!s->ident || namespaces_identity(srv, ns)->hash == s->ident_hash)
        return 0;
    return namespaces_identity_declare(srv, ns, s->ident, IDENTITY_DECLARED, msg, msglen);
}
