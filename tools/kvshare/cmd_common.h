/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the daemon-facing `kvshare` commands share: the common flags, the
 * connection with an error that says what to do, JSON strings. Uses the
 * public client API (kvshare.h) and, for numbers people read, common/units.h.
 */
#ifndef KVSHARE_CMD_COMMON_H
#define KVSHARE_CMD_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvshare.h"

#include "commands.h"
#include "units.h"

typedef struct cli_conn {
    const char *socket_path; /* --socket; NULL: the default */
    int timeout_ms;          /* --timeout */
} cli_conn_t;

/* Consumes --socket PATH / --timeout DURATION at argv[*i] (advancing *i). Returns
 * 1 if it took the flag, 0 if the flag is not one of these, -1 on a missing
 * or bad value (message printed). */
int cli_conn_flag(cli_conn_t *conn, int argc, char **argv, int *i, const char *cmd);

#define CLI_MAX_PATHS 2
#define CLI_PATH_LEN  256

/* The sockets a command tries, in order, into paths; returns how many (0:
 * no default path could be built). --socket alone when given; else
 * kvs_default_socket_path() ($KVSHARE_SOCKET alone when it is set), then the
 * system daemon's /run/kvshare/kvshared.sock when that differs: a member of
 * the group kvshare who is not root reaches the packaged daemon without
 * --socket. The library's default stays as kvshare.h documents it. */
int cli_socket_paths(const cli_conn_t *conn, char paths[CLI_MAX_PATHS][CLI_PATH_LEN]);

/* A lazy client of the daemon at path, not mapping the pool, with conn's
 * timeout; NULL only when out of memory. kvs_connected() says whether it
 * reached the daemon, kvs_last_error() why not. */
kvs_client_t *cli_connect_path(const cli_conn_t *conn, const char *path, const char *worker);

/* Connects without mapping the pool to the first of cli_socket_paths() where
 * a daemon answers. On failure prints each path tried, why it failed and
 * what to do, and returns NULL. */
kvs_client_t *cli_connect(const cli_conn_t *conn, const char *cmd);

/* Writes s as a JSON string (quoted, escaped). */
void cli_json_string(FILE *f, const char *s);

/* 1 when the terminal's character set is UTF-8 (the locale's LC_CTYPE, as
 * LANG / LC_ALL / LC_CTYPE set it), so that box-drawing and block glyphs may
 * be drawn; 0: draw ASCII. */
int cli_utf8(void);

/* The human-readable stats block (cmd_stats.c), also used by top. */
void cli_print_stats(FILE *f, const kvs_stats_t *s);

/* Each namespace's capacity (cmd_stats.c, also used by tree): blocks held,
 * reservation, quota, evictions by cause, then blocks cached and evicted by
 * retention priority band. Only namespace `ns` unless it is NULL. */
void cli_print_capacity(FILE *f, const kvs_stats_t *s, const char *ns);

#endif /* KVSHARE_CMD_COMMON_H */
