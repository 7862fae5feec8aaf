/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Sizes, counts and durations as people type and read them, parsed and
 * printed the same way by the daemon (flags and config file), the CLI and
 * the benchmarks.
 */
#ifndef KVS_COMMON_UNITS_H
#define KVS_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Parses a byte size: a number (decimals allowed) with an optional unit B,
 * K/KB, M/MB, G/GB, T/TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
 * 1024); units are case-insensitive ("70GB", "70 GiB", "1.5t", "4096").
 * Errors: KVS_EINVAL (NULL, empty, junk, negative, overflow; *out unchanged). */
int units_parse_bytes(const char *text, uint64_t *out);

/* Parses a count such as a number of tokens: a whole number with an optional
 * k (x1024) or m (x1048576) suffix, case-insensitive ("4k" = 4096, "128k",
 * "1m", "5000"). Errors: KVS_EINVAL (NULL, empty, junk, zero, overflow;
 * *out unchanged). */
int units_parse_count(const char *text, uint64_t *out);

/* Parses a duration into milliseconds: a number (decimals allowed) with an
 * optional unit ms, s, m or h ("250ms", "1.5s", "2m"); a bare number is in
 * units of bare_unit_ms (1: milliseconds, 1000: seconds). Rounds to the
 * nearest millisecond. Errors: KVS_EINVAL (NULL, empty, junk, negative,
 * overflow; *out unchanged). */
int units_parse_ms(const char *text, uint64_t bare_unit_ms, uint64_t *out);

/* Writes bytes in binary units into buf (always NUL-terminated): "512 B",
 * "320 KiB", "5 MiB", and with 1 decimal "2.5 MiB", "1.3 GiB" (none when the
 * value is whole). Returns buf. */
const char *units_format_bytes(uint64_t bytes, int decimals, char *buf, size_t len);

/* Writes a duration in milliseconds as its two largest units into buf:
 * "42s", "3m07s", "5h02m", "2d03h". Returns buf. */
const char *units_format_ms(uint64_t ms, char *buf, size_t len);

#endif /* KVS_COMMON_UNITS_H */
