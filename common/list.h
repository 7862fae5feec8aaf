/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An intrusive doubly linked list: the node lives inside the item, so that
 * adding and removing cost no allocation and removal is O(1) from the item
 * alone.
 *
 *     typedef struct waiter { ...; list_node_t link; } waiter_t;
 *     list_t waiters = {0};                      (zero is an empty list)
 *     list_push_back(&waiters, &w->link);
 *     LIST_FOR_EACH_SAFE(&waiters, waiter_t, link, w, next)
 *         if (done(w))
 *             list_remove(&waiters, &w->link);
 *
 * The list keeps its ends and its length; the ends are NULL-terminated,
 * so a zeroed list_t (calloc, = {0}) is ready to use. An item may sit on
 * several lists at once through several nodes.
 */
#ifndef KVS_COMMON_LIST_H
#define KVS_COMMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct list_node {
    struct list_node *prev, *next;
} list_node_t;

typedef struct list {
    list_node_t *head, *tail; /* first and last; NULL when empty */
    size_t len;
} list_t;

static inline bool list_empty(const list_t *l)
{
    return l->head == NULL;
}

/* Whether n is on l (n is on l or on no list). */
static inline bool list_contains(const list_t *l, const list_node_t *n)
{
    return n->prev != NULL || l->head == n;
}

static inline void list_push_back(list_t *l, list_node_t *n)
{
    n->next = NULL;
    n->prev = l->tail;
    if (l->tail)
        l->tail->next = n;
    else
        l->head = n;
    l->tail = n;
    l->len++;
}

static inline void list_push_front(list_t *l, list_node_t *n)
{
    n->prev = NULL;
    n->next = l->head;
    if (l->head)
        l->head->prev = n;
    else
        l->tail = n;
    l->head = n;
    l->len++;
}

/* Takes n off l (n must be on it). */
static inline void list_remove(list_t *l, list_node_t *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        l->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        l->tail = n->prev;
    n->prev = n->next = NULL;
    l->len--;
}

/* The item around node n (NULL for NULL). */
static inline void *list_item_at(const list_node_t *n, size_t offset)
{
    return n ? (void *)((char *)n - offset) : NULL;
}

#define LIST_ITEM(node, type, member) ((type *)list_item_at((node), offsetof(type, member)))
#define LIST_FIRST(l, type, member)   LIST_ITEM((l)->head, type, member)
#define LIST_LAST(l, type, member)    LIST_ITEM((l)->tail, type, member)
#define LIST_NEXT(item, type, member) LIST_ITEM((item)->member.next, type, member)

/* Visits every item of l from the head, as `type *var`. */
#define LIST_FOR_EACH(l, type, member, var)                                                        \
    for (type *var = LIST_FIRST(l, type, member); var; var = LIST_NEXT(var, type, member))

/* The same, where the body may remove var (nx is the item after it). */
#define LIST_FOR_EACH_SAFE(l, type, member, var, nx)                                               \
    for (type *var = LIST_FIRST(l, type, member), *nx = var ? LIST_NEXT(var, type, member) : NULL; \
         var; var = nx, nx = var ? LIST_NEXT(var, type, member) : NULL)

#endif /* KVS_COMMON_LIST_H */
