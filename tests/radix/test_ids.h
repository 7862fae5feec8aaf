/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pool ids a radix suite's tree hands out: a stack of free ids, filled
 * by ids_init and given back by the tree's on_evict (ids_on_evict, with the
 * stack as evict_ctx). Free the stack's memory with free(f->free).
 */
#ifndef KVS_TEST_RADIX_TEST_IDS_H
#define KVS_TEST_RADIX_TEST_IDS_H

#include <check.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ids {
    uint32_t *free;
    uint32_t n_free;
} ids_t;

/* Every id below n free, 0 on top. */
static inline void ids_init(ids_t *f, uint32_t n)
{
    f->free = malloc((n ? n : 1) * sizeof(*f->free));
    ck_assert_ptr_nonnull(f->free);
    f->n_free = 0;
    for (uint32_t i = n; i-- > 0;)
        f->free[f->n_free++] = i;
}

static inline void ids_on_evict(void *ctx, uint32_t id)
{
    ids_t *f = ctx;
    f->free[f->n_free++] = id;
}

#endif /* KVS_TEST_RADIX_TEST_IDS_H */
