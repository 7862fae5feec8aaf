/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_cluster: a Redis Cluster on loopback for one test. It starts
 * masters * (1 + replicas) redis-server processes on free ports of its own,
 * each in its own folder under a fresh temporary directory, joins them with
 * `redis-cli --cluster create`, and waits until every node says
 * cluster_state:ok. Each server dies with the test (PR_SET_PDEATHSIG) and is
 * stopped by its pid.
 */
#ifndef KVS_TEST_REDIS_CLUSTER_H
#define KVS_TEST_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

#define RC_MAX_NODES 6

typedef struct rc_cluster {
    int n;
    int port[RC_MAX_NODES];
    pid_t pid[RC_MAX_NODES];
    char dir[256];
    char pass[64]; /* "" when the cluster has no password */
    char seeds[256];
} rc_cluster_t;

/* Starts the cluster (masters * (1 + replicas) <= RC_MAX_NODES; pass NULL
 * or a password every node requires). Returns 0, or -1 after stopping what
 * it started. */
int rc_start(rc_cluster_t *rc, int masters, int replicas, const char *pass);

/* Sets the nice value of every node's threads (a benchmark whose servers
 * stand for other hosts: raising it needs no privilege, lowering it back
 * does). Returns 0, or -1 when a thread could not be set. */
int rc_renice(const rc_cluster_t *rc, int nice);

/* Kills node i (SIGKILL) and reaps it. */
void rc_kill(rc_cluster_t *rc, int i);

/* Stops every node still running and removes the folders. */
void rc_stop(rc_cluster_t *rc);

/* A blocking connection to node i, authenticated; NULL on failure. */
redisContext *rc_connect(const rc_cluster_t *rc, int i);

/* The index of the node listening on port, or -1. */
int rc_node_of_port(const rc_cluster_t *rc, int port);

/* What a Redis Cluster test needs and this machine lacks, as a skip reason
 * (redis-server or redis-cli not installed), or NULL. */
const char *rc_missing(void);

#endif /* KVS_TEST_REDIS_CLUSTER_H */
