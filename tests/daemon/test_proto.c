/* SPDX-License-Identifier: Apache-2.0 */
/* The protocol's Status enum and kvshare_status.h are one table; its RPCs
 * and kvshare_rpcs.h are one list. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "dispatch.h"
#include "kvshare_rpcs.h"
#include "kvshare_status.h"
#include "kvshare.pb-c.h"

START_TEST(test_status_enum_matches_table)
{
    const ProtobufCEnumDescriptor *d = &kvshare__status__descriptor;
    ck_assert_uint_eq(d->n_values, KVS_STATUS_COUNT);
#define CHECK_CODE(name, code, text)                                                               \
    do {                                                                                           \
        const ProtobufCEnumValue *v =                                                              \
            protobuf_c_enum_descriptor_get_value_by_name(d, "KVS_" #name);                         \
        ck_assert_msg(v != NULL, "KVS_" #name " missing from kvshare.proto");                      \
        ck_assert_int_eq(v->value, -(code));                                                       \
        ck_assert_str_eq(kvs_status_text(code), text);                                             \
    } while (0);
    KVS_STATUS_TABLE(CHECK_CODE)
#undef CHECK_CODE
}
END_TEST

START_TEST(test_every_proto_value_is_in_table)
{
    const ProtobufCEnumDescriptor *d = &kvshare__status__descriptor;
    for (unsigned i = 0; i < d->n_values; i++) {
        int code = -d->values[i].value;
        ck_assert_msg(strcmp(kvs_status_text(code), "unknown kvshare status") != 0,
                      "proto status %s has no entry in kvshare_status.h", d->values[i].name);
    }
    ck_assert_str_eq(kvs_status_text(1), "unknown kvshare status");
    ck_assert_str_eq(kvs_status_text(-1000), "unknown kvshare status");
}
END_TEST

START_TEST(test_tokens_travel_as_packed_bytes)
{
    /* 128k tokens cost 4 bytes each on the wire, not a varint each. */
    size_t n = 131072;
    uint32_t *tokens = malloc(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)(i * 2654435761u);
    Kvshare__Request req = KVSHARE__REQUEST__INIT;
    Kvshare__LookupRequest lk = KVSHARE__LOOKUP_REQUEST__INIT;
    lk.tokens.data = (uint8_t *)tokens;
    lk.tokens.len = n * 4;
    req.rpc_case = KVSHARE__REQUEST__RPC_LOOKUP;
    req.lookup = &lk;
    req.id = 7;
    size_t size = kvshare__request__get_packed_size(&req);
    ck_assert_uint_lt(size, n * 4 + 32);
    uint8_t *buf = malloc(size);
    kvshare__request__pack(&req, buf);
    Kvshare__Request *back = kvshare__request__unpack(NULL, size, buf);
    ck_assert_ptr_nonnull(back);
    ck_assert_uint_eq(back->id, 7);
    ck_assert_int_eq(back->rpc_case, KVSHARE__REQUEST__RPC_LOOKUP);
    ck_assert_uint_eq(back->lookup->tokens.len, n * 4);
    ck_assert_int_eq(memcmp(back->lookup->tokens.data, tokens, n * 4), 0);
    kvshare__request__free_unpacked(back, NULL);
    free(buf);
    free(tokens);
}
END_TEST

/* The oneof members of a message (Request or Response's rpc), in field
 * order. */
static unsigned oneof_members(const ProtobufCMessageDescriptor *d,
                              const ProtobufCFieldDescriptor **out, unsigned max)
{
    unsigned n = 0;
    for (unsigned i = 0; i < d->n_fields; i++)
        if ((d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && n < max)
            out[n++] = &d->fields[i];
    return n;
}

START_TEST(test_every_rpc_is_in_the_list)
{
    const ProtobufCFieldDescriptor *req[64], *resp[64];
    unsigned n_req = oneof_members(&kvshare__request__descriptor, req, 64);
    unsigned n_resp = oneof_members(&kvshare__response__descriptor, resp, 64);
    ck_assert_uint_eq(n_req, KVS_RPC_COUNT);
    ck_assert_uint_eq(n_resp, KVS_RPC_COUNT);
    ck_assert_uint_eq(dispatch_count(), KVS_RPC_COUNT);
    for (unsigned i = 0; i < n_req; i++) {
        const dispatch_entry_t *e = dispatch_find((Kvshare__Request__RpcCase)req[i]->id);
        ck_assert_msg(e != NULL, "Request.%s (field %u) has no row in kvshare_rpcs.h", req[i]->name,
                      req[i]->id);
        ck_assert_ptr_nonnull(e->handler);
        ck_assert_uint_eq(resp[i]->id, req[i]->id);
        ck_assert_str_eq(resp[i]->name, req[i]->name);
    }
    /* Each row names its oneof member and its messages. */
#define CHECK_ROW(CASE, Name, field)                                                               \
    do {                                                                                           \
        const dispatch_entry_t *e = dispatch_at(KVS_RPC_SLOT_##CASE);                              \
        ck_assert_int_eq(e->rpc, KVSHARE__REQUEST__RPC_##CASE);                                    \
        ck_assert_str_eq(e->name, #Name);                                                          \
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(       \
            &kvshare__request__descriptor, #field);                                                \
        ck_assert_ptr_nonnull(f);                                                                  \
        ck_assert_uint_eq(f->id, KVSHARE__REQUEST__RPC_##CASE);                                    \
        ck_assert_str_eq(((const ProtobufCMessageDescriptor *)f->descriptor)->short_name,          \
                         #Name "Request");                                                         \
        f = protobuf_c_message_descriptor_get_field_by_name(&kvshare__response__descriptor,        \
                                                            #field);                               \
        ck_assert_str_eq(((const ProtobufCMessageDescriptor *)f->descriptor)->short_name,          \
                         #Name "Reply");                                                           \
    } while (0);
    KVS_RPCS(CHECK_ROW)
#undef CHECK_ROW
    ck_assert_ptr_null(dispatch_find(KVSHARE__REQUEST__RPC__NOT_SET));
    ck_assert_ptr_null(dispatch_find((Kvshare__Request__RpcCase)999));
}
END_TEST

static Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("proto");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_status_enum_matches_table);
    tcase_add_test(tc, test_every_proto_value_is_in_table);
    tcase_add_test(tc, test_tokens_travel_as_packed_bytes);
    tcase_add_test(tc, test_every_rpc_is_in_the_list);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(proto_suite)
