/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kvshare evict NAMESPACE TOKENS...: drops one prompt's cached blocks that
 * nothing else needs (an Evict RPC), from the pool and from tier 2: from the
 * prompt's end backward, each block no worker pins and no other cached
 * prompt continues. Says how many went from each tier and how many stayed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_common.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvshare evict NAMESPACE [TOKEN[,TOKEN...]]... [--file PATH]\n"
               "                    [--socket PATH] [--timeout MS]\n"
               "\n"
               "Drops the prompt's cached blocks that nothing else needs, from every tier:\n"
               "from its end backward, each block no worker pins and no other cached prompt\n"
               "continues (a shared prefix stays). The prompt is its token ids, as arguments\n"
               "or read from PATH ('-': standard input), separated by commas or spaces.\n");
}

/* A growing list of token ids. */
typedef struct token_list {
    uint32_t *ids;
    size_t n, cap;
} token_list_t;

static int push(token_list_t *l, uint32_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        uint32_t *p = realloc(l->ids, cap * sizeof(*p));
        if (!p)
            return -1;
        l->ids = p;
        l->cap = cap;
    }
    l->ids[l->n++] = id;
    return 0;
}

/* Appends the ids of text (separated by commas or white space). Returns 0,
 * or -1 with a message on a word that is not a token id. */
static int parse_tokens(token_list_t *l, const char *text)
{
    const char *p = text;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (!*p)
            return 0;
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno || v > UINT32_MAX || (*end && !strchr(", \t\r\n", *end)) ||
            *p == '-' || *p == '+') {
            fprintf(stderr, "kvshare evict: '%.*s' is not a token id (0 .. %u)\n",
                    (int)strcspn(p, ", \t\r\n"), p, UINT32_MAX);
            return -1;
        }
        if (push(l, (uint32_t)v) != 0) {
            fprintf(stderr, "kvshare evict: out of memory for the prompt\n");
            return -1;
        }
        p = end;
    }
}

/* Appends the ids in the file at path ('-': standard input), read whole. */
static int read_file(token_list_t *l, const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvshare evict: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t cap = 0;
    ssize_t len = getdelim(&text, &cap, '\0', f);
    int rc = len < 0 && ferror(f) ? -1 : 0;
    if (rc != 0)
        fprintf(stderr, "kvshare evict: cannot read %s: %s\n", path, strerror(errno));
    else if (len > 0)
        rc = parse_tokens(l, text);
    free(text);
    if (f != stdin)
        fclose(f);
    return rc;
}

int kvshare_cmd_evict(int argc, char **argv)
{
    cli_conn_t conn = {0};
    const char *ns = NULL;
    token_list_t tokens = {0};
    int status = 2;
    for (int i = 1; i < argc; i++) {
        int r = cli_conn_flag(&conn, argc, argv, &i, "evict");
        if (r < 0)
            goto out;
        if (r > 0)
            continue;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            status = 0;
            goto out;
        } else if (strcmp(argv[i], "--file") == 0 && i + 1 < argc) {
            if (read_file(&tokens, argv[++i]) != 0)
                goto out;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "kvshare evict: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            goto out;
        } else if (!ns) {
            ns = argv[i];
        } else if (parse_tokens(&tokens, argv[i]) != 0) {
            goto out;
        }
    }
    if (!ns || tokens.n == 0) {
        fprintf(stderr, "kvshare evict: name the namespace and the prompt's token ids\n");
        usage(stderr);
        goto out;
    }
    status = 1;
    kvs_client_t *c = cli_connect(&conn, "evict");
    if (!c)
        goto out;
    kvs_evict_result_t r;
    int rc = kvs_evict(c, ns, tokens.ids, tokens.n, &r);
    if (rc != 0)
        fprintf(stderr, "kvshare evict: %s\n", kvs_last_error(c));
    else
        printf("namespace '%s': %u blocks dropped (%u from the pool, %u from tier 2), %u kept "
               "(pinned, or a prefix another prompt continues)\n",
               ns, r.tier1_blocks + r.tier2_blocks, r.tier1_blocks, r.tier2_blocks, r.kept_blocks);
    kvs_close(c);
    status = rc == 0 ? 0 : 1;
out:
    free(tokens.ids);
    return status;
}
