/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Model identity through a real kvshared: a worker that declares whose KV
 * it reads and writes (kvs_options_t.identity) binds an unused namespace to
 * it; a worker of another model is refused (KVS_EIDENTITY, the message
 * naming both) where the namespace holds another model's KV, declared,
 * configured, or cached under the daemon's own; a declaration of another
 * layout than the pool's is refused everywhere; and a worker that declares
 * nothing keeps working as before.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "daemon_harness.h"
#include "harness_client.h"
#include "kvshare.h"

static harness_t h;

static void setup(void)
{
    ck_assert_int_eq(harness_start(&h, 64, NULL), 0);
}

static void teardown(void)
{
    harness_cleanup(&h);
}

/* Connects declaring model (and revision) for ns; returns the status, and
 * the client in *out when it connected (else the message in why). */
static int connect_as(const char *ns, const char *model, const char *rev, const char *dtype,
                      kvs_client_t **out, char *why, size_t whylen)
{
    kvs_identity_t id;
    kvs_identity_init(&id);
    id.ns = ns;
    id.model = model;
    id.revision = rev;
    id.dtype = dtype;
    kvs_options_t o;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = HARNESS_CLIENT_MS;
    o.identity = &id;
    *out = NULL;
    why[0] = '\0';
    int rc = kvs_connect(&o, out);
    if (rc != 0)
        snprintf(why, whylen, "%s", kvs_strerror(rc));
    return rc;
}

/* A connect refused for its identity leaves the daemon's message where
 * kvs_last_error finds it only on a client; a lazy client keeps one. */
static int refused_message(const char *ns, const char *model, char *msg, size_t len)
{
    kvs_identity_t id;
    kvs_identity_init(&id);
    id.ns = ns;
    id.model = model;
    kvs_options_t o;
    kvs_options_init(&o);
    o.socket_path = h.socket_path;
    o.timeout_ms = HARNESS_CLIENT_MS;
    o.flags = KVS_LAZY;
    o.identity = &id;
    kvs_client_t *c = NULL;
    ck_assert_int_eq(kvs_connect(&o, &c), 0);
    ck_assert(!kvs_connected(c));
    uint32_t tokens[4] = {1, 2, 3, 4}, ids[1];
    size_t n = 7;
    int rc = kvs_lookup(c, ns, tokens, 4, 0, ids, 1, &n);
    ck_assert_uint_eq(n, 0); /* a miss: the cache is never a dependency */
    snprintf(msg, len, "%s", kvs_last_error(c));
    kvs_close(c);
    return rc;
}

/* Writes and commits one 4-token block of `seed` in ns; released. */
static void commit_one(kvs_client_t *c, const char *ns, uint32_t seed)
{
    uint32_t tokens[4] = {seed, seed + 1, seed + 2, seed + 3}, id, can;
    size_t done;
    ck_assert_int_eq(kvs_alloc(c, NULL, 1, &id), 0);
    int rc = kvs_commit(c, ns, tokens, 4, &id, 1, &can, &done);
    ck_assert_msg(rc == 0, "commit: %s", kvs_last_error(c));
    ck_assert_int_eq(kvs_release(c, &can, 1, NULL), 0);
}

static size_t hits(kvs_client_t *c, const char *ns, uint32_t seed)
{
    uint32_t tokens[4] = {seed, seed + 1, seed + 2, seed + 3}, ids[1];
    size_t n = 0;
    int rc = kvs_lookup(c, ns, tokens, 4, 0, ids, 1, &n);
    ck_assert_msg(rc == 0, "lookup: %s", kvs_last_error(c));
    return n;
}

START_TEST(declared_namespace_refuses_another_model)
{
    kvs_client_t *a, *b;
    char why[256], msg[1024], text[600];
    uint64_t hash = 0;
    ck_assert_int_eq(connect_as("chat", "org/base-7b", "v1", NULL, &a, why, sizeof(why)), 0);
    ck_assert_int_eq(kvs_identity(a, text, sizeof(text), &hash), 0);
    ck_assert_msg(strstr(text, "model=org/base-7b") && strstr(text, "revision=v1"), "%s", text);
    ck_assert_uint_ne(hash, 0);
    commit_one(a, "chat", 100);

    /* The fine-tune, with the same namespace: refused, both named. */
    ck_assert_int_eq(connect_as("chat", "org/base-7b-instruct", "v1", NULL, &b, why, sizeof(why)),
                     KVS_EIDENTITY);
    ck_assert_int_eq(refused_message("chat", "org/base-7b-instruct", msg, sizeof(msg)),
                     KVS_EIDENTITY);
    ck_assert_msg(strstr(msg, "model=org/base-7b ") || strstr(msg, "model=org/base-7b'"), "%s",
                  msg);
    ck_assert_msg(strstr(msg, "model=org/base-7b-instruct"), "%s", msg);
    /* Another revision of the same model is another identity too. */
    ck_assert_int_eq(connect_as("chat", "org/base-7b", "v2", NULL, &b, why, sizeof(why)),
                     KVS_EIDENTITY);

    /* The same identity joins and shares. */
    ck_assert_int_eq(connect_as("chat", "org/base-7b", "v1", NULL, &b, why, sizeof(why)), 0);
    ck_assert_uint_eq(hits(b, "chat", 100), 1);
    kvs_close(b);

    /* The fine-tune in a namespace of its own: its own cache, no hit of
     * the base model's blocks. */
    ck_assert_int_eq(
        connect_as("chat-ft", "org/base-7b-instruct", "v1", NULL, &b, why, sizeof(why)), 0);
    ck_assert_uint_eq(hits(b, "chat-ft", 100), 0);
    /* ... and its session may not use the base model's namespace. */
    uint32_t tokens[4] = {100, 101, 102, 103}, ids[1];
    size_t n = 9;
    ck_assert_int_eq(kvs_lookup(b, "chat", tokens, 4, 0, ids, 1, &n), KVS_EIDENTITY);
    ck_assert_uint_eq(n, 0);
    kvs_close(b);
    kvs_close(a);
}
END_TEST

/* A namespace that already holds blocks under the daemon's identity (a
 * worker that declared nothing wrote them) is not taken by a declaration:
 * those blocks are not the declaring model's. An empty one is. */
START_TEST(blocks_of_the_daemons_identity_are_not_taken)
{
    kvs_client_t *old = harness_client(&h, "old", 0), *c;
    char why[256];
    commit_one(old, "shared", 200);
    ck_assert_int_eq(connect_as("shared", "org/m", NULL, NULL, &c, why, sizeof(why)),
                     KVS_EIDENTITY);
    /* The old worker keeps working. */
    ck_assert_uint_eq(hits(old, "shared", 200), 1);
    /* An empty one is bound; the old worker, declaring nothing, uses it
     * under that identity. */
    ck_assert_int_eq(connect_as("fresh", "org/m", NULL, NULL, &c, why, sizeof(why)), 0);
    commit_one(c, "fresh", 300);
    ck_assert_uint_eq(hits(old, "fresh", 300), 1);
    kvs_close(c);
    kvs_close(old);
}
END_TEST

/* A declared geometry other than the pool's is refused in any namespace. */
START_TEST(another_layout_is_refused)
{
    kvs_client_t *c;
    char why[256], text[600];
    /* The test pool is fp16. */
    ck_assert_int_eq(connect_as("x", "org/m", NULL, "bf16", &c, why, sizeof(why)), KVS_EINVAL);
    ck_assert_int_eq(connect_as("x", "org/m", NULL, "fp16", &c, why, sizeof(why)), 0);
    ck_assert_int_eq(kvs_identity(c, text, sizeof(text), NULL), 0);
    ck_assert_msg(strstr(text, "fp16"), "%s", text);
    kvs_close(c);
}
END_TEST

/* A client that declares nothing has no identity to report. */
START_TEST(undeclared_client_has_no_identity)
{
    kvs_client_t *c = harness_client(&h, "plain", 0);
    char text[64];
    ck_assert_int_eq(kvs_identity(c, text, sizeof(text), NULL), KVS_ENOTFOUND);
    kvs_close(c);
}
END_TEST

/* The config file names a namespace's model: only that one is accepted,
 * and a worker declaring nothing uses it as before. */
START_TEST(configured_identity)
{
    harness_cleanup(&h);
    char dir[] = "/tmp/kvs-identity-XXXXXX", conf[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(conf, sizeof(conf), "%s/kvshared.conf", dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[namespace prod]\nmodel_name = org/prod-70b\nmodel_revision = r7\n");
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    ck_assert_int_eq(harness_start(&h, 64, extra), 0);
    kvs_client_t *c, *old = harness_client(&h, "old", 0);
    char why[256], text[600];
    ck_assert_int_eq(connect_as("prod", "org/prod-70b", NULL, NULL, &c, why, sizeof(why)),
                     KVS_EIDENTITY); /* the revision is part of it */
    ck_assert_int_eq(connect_as("prod", "org/other", "r7", NULL, &c, why, sizeof(why)),
                     KVS_EIDENTITY);
    char msg[1024];
    ck_assert_int_eq(refused_message("prod", "org/other", msg, sizeof(msg)), KVS_EIDENTITY);
    ck_assert_msg(strstr(msg, "(config)") && strstr(msg, "revision=r7 model=org/prod-70b'"), "%s",
                  msg);
    ck_assert_int_eq(connect_as("prod", "org/prod-70b", "r7", NULL, &c, why, sizeof(why)), 0);
    ck_assert_int_eq(kvs_identity(c, text, sizeof(text), NULL), 0);
    ck_assert_msg(strstr(text, "model=org/prod-70b") && strstr(text, "revision=r7"), "%s", text);
    commit_one(c, "prod", 400);
    ck_assert_uint_eq(hits(old, "prod", 400), 1);
    kvs_close(c);
    kvs_close(old);
    unlink(conf);
    rmdir(dir);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("identity_daemon");
    TCase *tc = tcase_create("identity");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, declared_namespace_refuses_another_model);
    tcase_add_test(tc, blocks_of_the_daemons_identity_are_not_taken);
    tcase_add_test(tc, another_layout_is_refused);
    tcase_add_test(tc, undeclared_client_has_no_identity);
    tcase_add_test(tc, configured_identity);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(suite)
