/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected), the checksum of the
 * disk tier's records (disk.h). On x86-64 with SSE4.2 it runs on the
 * crc32 instruction; elsewhere on a slice-by-8 table. Both give the same
 * value; crc32c_portable is the table path alone (tests compare the two).
 *
 *     uint32_t c = crc32c(0, hdr, hdr_len);
 *     c = crc32c(c, payload, payload_len);   (the same as one call over both)
 */
#ifndef KVS_DISK_CRC32C_H
#define KVS_DISK_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CRC32C of buf[0, len) continuing from crc (0 to start). */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);
uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t len);
/* Copies src[0, len) to dst (not overlapping) and returns crc32c(crc, src,
 * len), in one pass over the bytes: a copy and a checksum of a block cost
 * about as much as the checksum alone, where a memcpy and then a crc32c
 * read it twice. */
uint32_t crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);
/* The CRC32C of A then B from crc_a = crc32c(0, A) and crc_b = crc32c(0, B),
 * B being len_b bytes: crc32c(crc_a, B), without B's bytes. */
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
/* crc32c_combine with the length's factor taken once: for many CRCs of one
 * length, crc32c_combine_shift(a, b, crc32c_shift(len_b)) is
 * crc32c_combine(a, b, len_b) at a thirtieth of the cost or less. */
uint32_t crc32c_shift(uint64_t len);
uint32_t crc32c_combine_shift(uint32_t crc_a, uint32_t crc_b, uint32_t shift);
/* Whether crc32c runs on the CPU's instruction. */
bool crc32c_hw(void);

#endif /* KVS_DISK_CRC32C_H */
