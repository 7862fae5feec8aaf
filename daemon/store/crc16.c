/* SPDX-License-Identifier: Apache-2.0 */
#include "crc16.h"

#include <string.h>

/* A table of the CRC of every byte value, built once: a key of a hundred
 * bytes then costs a hundred lookups instead of eight hundred shifts. */
static uint16_t crc16_table[256];
static int crc16_table_ready;

static void crc16_build_table(void)
{
    for (unsigned b = 0; b < 256; b++) {
        uint16_t crc = (uint16_t)(b << 8);
        for (int bit = 0; bit < 8; bit++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
        crc16_table[b] = crc;
    }
    crc16_table_ready = 1;
}

uint16_t crc16_xmodem(const void *data, size_t len)
{
    /* The daemon calls this from its loop thread only; tests likewise. */
    if (!crc16_table_ready)
        crc16_build_table();
    const unsigned char *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)((crc << 8) ^ crc16_table[((crc >> 8) ^ p[i]) & 0xff]);
    return crc;
}

uint16_t crc16_key_slot(const void *key, size_t len)
{
    const char *k = key;
    const char *open = len ? memchr(k, '{', len) : NULL;
    if (open) {
        size_t after = (size_t)(open - k) + 1;
        const char *close = memchr(open + 1, '}', len - after);
        /* An empty tag "{}" does not count: the whole key is hashed. */
        if (close && close > open + 1)
            return crc16_xmodem(open + 1, (size_t)(close - open - 1)) & (CLUSTER_SLOTS - 1);
    }
    return crc16_xmodem(k, len) & (CLUSTER_SLOTS - 1);
}
