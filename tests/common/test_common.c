/* SPDX-License-Identifier: Apache-2.0 */
/* common/: the size, count and duration parsers and printers, the frame
 * header, the default socket path and the error message helper. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "errbuf.h"
#include "frame_header.h"
#include "kvshare_status.h"
#include "now.h"
#include "socket_path.h"
#include "units.h"

START_TEST(parse_bytes)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {
        {"70GB", 70000000000ull},
        {"70 GB", 70000000000ull},
        {"70gb", 70000000000ull},
        {"70G", 70000000000ull},
        {"70GiB", 70ull << 30},
        {"512MiB", 512ull << 20},
        {"1.5TB", 1500000000000ull},
        {"1.1GB", 1100000000ull},
        {"4096", 4096},
        {"4096B", 4096},
        {"2kib", 2048},
        {"0.5 TiB", 1ull << 39},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 0;
        ck_assert_msg(units_parse_bytes(ok[i].text, &v) == 0, "%s", ok[i].text);
        ck_assert_uint_eq(v, ok[i].bytes);
    }
    static const char *const bad[] = {"",    "GB",   "-1GB",    "12x",           "1e3",  "inf",
                                      "nan", "0x10", "1.5.5GB", "99999999999TB", "7 G B"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 123;
        ck_assert_msg(units_parse_bytes(bad[i], &v) == KVS_EINVAL, "%s", bad[i]);
        ck_assert_uint_eq(v, 123);
    }
    uint64_t v;
    ck_assert_int_eq(units_parse_bytes(NULL, &v), KVS_EINVAL);
}
END_TEST

START_TEST(parse_count)
{
    uint64_t v = 0;
    ck_assert_int_eq(units_parse_count("4k", &v), 0);
    ck_assert_uint_eq(v, 4096);
    ck_assert_int_eq(units_parse_count("128K", &v), 0);
    ck_assert_uint_eq(v, 131072);
    ck_assert_int_eq(units_parse_count("1m", &v), 0);
    ck_assert_uint_eq(v, 1048576);
    ck_assert_int_eq(units_parse_count("5000", &v), 0);
    ck_assert_uint_eq(v, 5000);
    static const char *const bad[] = {"",    "0",    "k",     "-4k",
                                      "4kb", "4.5k", "4 k x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 7;
        ck_assert_msg(units_parse_count(bad[i], &v) == KVS_EINVAL, "%s", bad[i]);
        ck_assert_uint_eq(v, 7);
    }
    ck_assert_int_eq(units_parse_count(NULL, &v), KVS_EINVAL);
}
END_TEST

START_TEST(parse_ms)
{
    static const struct {
        const char *text;
        uint64_t bare_unit;
        uint64_t ms;
    } ok[] = {
        {"250", 1, 250},    {"250ms", 1000, 250}, {"2s", 1, 2000},     {"1.5s", 1, 1500},
        {"0.5", 1000, 500}, {"2m", 1, 120000},    {"1h", 1, 3600000},  {"3 S", 1, 3000},
        {"0.0004s", 1, 0},  {"0.0006s", 1, 1},    {"10", 1000, 10000}, {"0", 1, 0},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 99;
        ck_assert_msg(units_parse_ms(ok[i].text, ok[i].bare_unit, &v) == 0, "%s", ok[i].text);
        ck_assert_msg(v == ok[i].ms, "%s: %llu ms, %llu expected", ok[i].text,
                      (unsigned long long)v, (unsigned long long)ok[i].ms);
    }
    static const char *const bad[] = {"", "s", "-1s", "1d", "1 m s", "1e3", "inf", "9e99h"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 5;
        ck_assert_msg(units_parse_ms(bad[i], 1, &v) == KVS_EINVAL, "%s", bad[i]);
        ck_assert_uint_eq(v, 5);
    }
    uint64_t v;
    ck_assert_int_eq(units_parse_ms("5", 0, &v), KVS_EINVAL);
    ck_assert_int_eq(units_parse_ms(NULL, 1, &v), KVS_EINVAL);
}
END_TEST

START_TEST(format_bytes)
{
    static const struct {
        uint64_t bytes;
        const char *text;
    } cases[] = {
        {0, "0 B"},         {1023, "1023 B"},     {1024, "1 KiB"},         {327680, "320 KiB"},
        {5242880, "5 MiB"}, {2621440, "2.5 MiB"}, {1395864371, "1.3 GiB"}, {UINT64_MAX, "16 EiB"},
    };
    char buf[32];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_str_eq(units_format_bytes(cases[i].bytes, 1, buf, sizeof(buf)), cases[i].text);
    /* Two decimals, as kvshare calc prints them; still none when whole. */
    ck_assert_str_eq(units_format_bytes(68996115456ull, 2, buf, sizeof(buf)), "64.26 GiB");
    ck_assert_str_eq(units_format_bytes(35136, 2, buf, sizeof(buf)), "34.31 KiB");
    ck_assert_str_eq(units_format_bytes(5242880, 2, buf, sizeof(buf)), "5 MiB");
    /* Truncation is safe. */
    char small[4];
    ck_assert_str_eq(units_format_bytes(5242880, 1, small, sizeof(small)), "5 M");
}
END_TEST

START_TEST(format_ms)
{
    char buf[32];
    ck_assert_str_eq(units_format_ms(999, buf, sizeof(buf)), "0s");
    ck_assert_str_eq(units_format_ms(42000, buf, sizeof(buf)), "42s");
    ck_assert_str_eq(units_format_ms(187000, buf, sizeof(buf)), "3m07s");
    ck_assert_str_eq(units_format_ms(18120000, buf, sizeof(buf)), "5h02m");
    ck_assert_str_eq(units_format_ms(183600000, buf, sizeof(buf)), "2d03h");
}
END_TEST

START_TEST(frame_header_round_trip)
{
    static const uint32_t lens[] = {0, 1, 255, 256, 65535, 65536, 0x01020304u, UINT32_MAX};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        uint8_t p[FRAME_HEADER_BYTES + 1] = {0, 0, 0, 0, 0xee};
        frame_put_len(p, lens[i]);
        ck_assert_uint_eq(frame_get_len(p), lens[i]);
        ck_assert_uint_eq(p[FRAME_HEADER_BYTES], 0xee); /* nothing past the header */
    }
    /* Little-endian on the wire, whatever the host. */
    uint8_t p[FRAME_HEADER_BYTES];
    frame_put_len(p, 0x01020304u);
    ck_assert(p[0] == 4 && p[1] == 3 && p[2] == 2 && p[3] == 1);
}
END_TEST

START_TEST(default_socket_path)
{
    char buf[SOCKET_PATH_MAX];
    ck_assert_uint_eq(SOCKET_PATH_MAX, 108);
    setenv("KVSHARE_SOCKET", "/x/y.sock", 1);
    ck_assert_int_eq(socket_path_default(buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/x/y.sock");
    ck_assert_int_eq(socket_path_default(buf, 5), KVS_EINVAL);
    unsetenv("KVSHARE_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
    ck_assert_int_eq(socket_path_default(buf, sizeof(buf)), 0);
    ck_assert_str_eq(buf, "/run/user/7/kvshare/kvshared.sock");
    setenv("XDG_RUNTIME_DIR", "relative", 1);
    ck_assert_int_eq(socket_path_default(buf, sizeof(buf)), 0);
    char expect[64];
    if (geteuid() == 0)
        snprintf(expect, sizeof(expect), "/run/kvshare/kvshared.sock");
    else
        snprintf(expect, sizeof(expect), "/tmp/kvshare-%u/kvshared.sock", (unsigned)geteuid());
    ck_assert_str_eq(buf, expect);
    ck_assert_int_eq(socket_path_default(NULL, 10), KVS_EINVAL);
    ck_assert_int_eq(socket_path_default(buf, 0), KVS_EINVAL);
}
END_TEST

START_TEST(error_buffer)
{
    char msg[8];
    ck_assert_int_eq(errbuf_set(msg, sizeof(msg), KVS_ENONS, "ns %s", "tenant-a"), KVS_ENONS);
    ck_assert_str_eq(msg, "ns tena");
    ck_assert_int_eq(errbuf_set(NULL, 0, KVS_EINVAL, "%d", 1), KVS_EINVAL);
    ck_assert_int_eq(errbuf_set(msg, 0, 0, "untouched"), 0);
    ck_assert_str_eq(msg, "ns tena");
}
END_TEST

START_TEST(clock_is_monotonic)
{
    int64_t a = now_ns(), b = now_ns();
    ck_assert_int_ge(b, a);
    ck_assert_int_ge(now_ms(), a / 1000000);
    usleep(2000);
    ck_assert_int_ge(now_ns() - a, 2000000);
}
END_TEST

static Suite *common_suite(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, parse_bytes);
    tcase_add_test(tc, parse_count);
    tcase_add_test(tc, parse_ms);
    tcase_add_test(tc, format_bytes);
    tcase_add_test(tc, format_ms);
    tcase_add_test(tc, frame_header_round_trip);
    tcase_add_test(tc, default_socket_path);
    tcase_add_test(tc, error_buffer);
    tcase_add_test(tc, clock_is_monotonic);
    suite_add_tcase(s, tc);
    return s;
}

KVS_CHECK_MAIN(common_suite)
