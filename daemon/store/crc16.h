/* SPDX-License-Identifier: Apache-2.0 */
/*
 * crc16: the key slot of Redis Cluster.
 *
 * Redis Cluster places a key in one of 16384 slots: CRC16 (the XMODEM
 * variant: polynomial 0x1021, initial value 0, no reflection) of the key,
 * modulo 16384. When the key holds a hash tag, a '{' followed later by a
 * '}' with at least one byte between them, only the bytes between the
 * first '{' and the first '}' after it are hashed, so that keys sharing a
 * tag share a slot. kvshare's block keys carry no tag: its blocks spread
 * over every slot.
 */
#ifndef KVS_DAEMON_CRC16_H
#define KVS_DAEMON_CRC16_H

#include <stddef.h>
#include <stdint.h>

/* The number of slots of a Redis Cluster. */
#define CLUSTER_SLOTS 16384

/* CRC16/XMODEM of len bytes at data (len may be 0: returns 0). */
uint16_t crc16_xmodem(const void *data, size_t len);

/* The slot of a key of len bytes, hash tags honoured: in [0, 16384). */
uint16_t crc16_key_slot(const void *key, size_t len);

#endif /* KVS_DAEMON_CRC16_H */
