/* SPDX-License-Identifier: Apache-2.0 */
/* frame: length-prefixed frames cut from arbitrary chunks. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "frame.h"

static void append_raw(frame_buf_t *b, const void *p, size_t n)
{
    ck_assert_int_eq(frame_buf_reserve(b, n), 0);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

START_TEST(test_roundtrip_and_pipelined)
{
    frame_buf_t out = {0}, in = {0};
    for (uint64_t id = 1; id <= 100; id++) {
        Kvshare__Response r = KVSHARE__RESPONSE__INIT;
        r.id = id;
        r.message = "x";
        ck_assert_int_eq(frame_append_response(&out, &r), 0);
    }
    /* Feed the stream one byte at a time: every frame comes out once, in order. */
    uint64_t next = 1;
    for (size_t i = 0; i < out.len; i++) {
        append_raw(&in, out.data + i, 1);
        const uint8_t *body;
        uint32_t len;
        int rc;
        while ((rc = frame_next(&in, 1024, &body, &len)) == 1) {
            Kvshare__Response *r = kvshare__response__unpack(NULL, len, body);
            ck_assert_ptr_nonnull(r);
            ck_assert_uint_eq(r->id, next);
            next++;
            kvshare__response__free_unpacked(r, NULL);
        }
        ck_assert_int_eq(rc, 0);
    }
    ck_assert_uint_eq(next, 101);
    frame_buf_release(&out);
    frame_buf_release(&in);
}
END_TEST

START_TEST(test_length_over_limit)
{
    frame_buf_t in = {0};
    const uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff}; /* 4 GiB - 1 */
    const uint8_t *body;
    uint32_t len;
    append_raw(&in, huge, 3);
    ck_assert_int_eq(frame_next(&in, 1 << 20, &body, &len), 0);
    append_raw(&in, huge + 3, 1);
    ck_assert_int_eq(frame_next(&in, 1 << 20, &body, &len), KVS_ETOOBIG);
    frame_buf_release(&in);
}
END_TEST

START_TEST(test_empty_frame_and_exact_limit)
{
    frame_buf_t in = {0};
    uint8_t hdr[4];
    const uint8_t *body;
    uint32_t len = 99;
    frame_put_len(hdr, 0);
    append_raw(&in, hdr, 4);
    ck_assert_int_eq(frame_next(&in, 16, &body, &len), 1);
    ck_assert_uint_eq(len, 0);
    frame_put_len(hdr, 16);
    append_raw(&in, hdr, 4);
    uint8_t zeros[16] = {0};
    append_raw(&in, zeros, 15);
    ck_assert_int_eq(frame_next(&in, 16, &body, &len), 0);
    append_raw(&in, zeros, 1);
    ck_assert_int_eq(frame_next(&in, 16, &body, &len), 1);
    ck_assert_uint_eq(len, 16);
    frame_put_len(hdr, 17);
    append_raw(&in, hdr, 4);
    ck_assert_int_eq(frame_next(&in, 16, &body, &len), KVS_ETOOBIG);
    ck_assert_uint_eq(frame_get_len(hdr), 17);
    frame_buf_release(&in);
}
END_TEST

static Suite *frame_suite(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("frame");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_roundtrip_and_pipelined);
    tcase_add_test(tc, test_length_over_limit);
    tcase_add_test(tc, test_empty_frame_and_exact_limit);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(frame_suite)
