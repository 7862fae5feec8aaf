/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected), the checksum of the
 * disk tier's records (tier_disk.h). On x86-64 with SSE4.2 it runs on the
 * crc32 instruction; elsewhere on a slice-by-8 table. Both give the same
 * value; crc32c_portable is the table path alone (tests compare the two).
 *
 *     uint32_t c = crc32c(0, hdr, hdr_len);
 *     c = crc32c(c, payload, payload_len);   (the same as one call over both)
 */
#ifndef KVS_DAEMON_CRC32C_H
#define KVS_DAEMON_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The CRC32C of buf[0, len) continuing from crc (0 to start). */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);
uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t len);
/* Whether crc32c runs on the CPU's instruction. */
bool crc32c_hw(void);

#endif /* KVS_DAEMON_CRC32C_H */
