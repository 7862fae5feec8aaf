/* SPDX-License-Identifier: Apache-2.0 */
/*
 * settings_doc: the settings tables of docs/OPERATING.md, generated from the
 * settings table (settings.c).
 *
 *     settings_doc --check docs/OPERATING.md   exit 1 when the doc differs
 *     settings_doc --write docs/OPERATING.md   rewrite the generated part
 *
 * The generated part lies between the BEGIN and END marker lines below.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"

#define BEGIN_MARK "<!-- BEGIN settings table"
#define END_MARK   "<!-- END settings table -->"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t cap = 0;
    *len = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (*len + 4096 + 1 > cap) {
            char *bigger = realloc(text, cap = (*len + 4096 + 1) * 2);
            if (!bigger) {
                free(text);
                fclose(f);
                return NULL;
            }
            text = bigger;
        }
        size_t got = fread(text + *len, 1, 4096, f);
        *len += got;
        if (got < 4096)
            break;
    }
    text[*len] = '\0';
    fclose(f);
    return text;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "--check") != 0 && strcmp(argv[1], "--write") != 0)) {
        fprintf(stderr, "usage: settings_doc --check|--write docs/OPERATING.md\n");
        return 2;
    }
    size_t len;
    char *doc = read_all(argv[2], &len);
    if (!doc) {
        fprintf(stderr, "settings_doc: cannot read %s\n", argv[2]);
        return 2;
    }
    char *begin = strstr(doc, BEGIN_MARK);
    char *end = begin ? strstr(begin, END_MARK) : NULL;
    char *body = begin ? strchr(begin, '\n') : NULL;
    if (!begin || !end || !body || body > end) {
        fprintf(stderr, "settings_doc: %s has no '%s ... -->' line followed by '%s'\n", argv[2],
                BEGIN_MARK, END_MARK);
        free(doc);
        return 2;
    }
    body++;

    char *table = NULL;
    size_t table_len = 0;
    FILE *mem = open_memstream(&table, &table_len);
    if (!mem) {
        free(doc);
        return 2;
    }
    fputc('\n', mem);
    settings_markdown(mem);
    fputc('\n', mem);
    fclose(mem);

    int status = 0;
    if (strcmp(argv[1], "--check") == 0) {
        if ((size_t)(end - body) != table_len || memcmp(body, table, table_len) != 0) {
            fprintf(stderr,
                    "settings_doc: the settings table of %s differs from daemon/core/settings.c; "
                    "rerun settings_doc --write %s. It should read:\n%s",
                    argv[2], argv[2], table);
            status = 1;
        }
    } else {
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(doc, 1, (size_t)(body - doc), f) != (size_t)(body - doc) ||
            fwrite(table, 1, table_len, f) != table_len ||
            fwrite(end, 1, len - (size_t)(end - doc), f) != len - (size_t)(end - doc) ||
            fclose(f) != 0) {
            fprintf(stderr, "settings_doc: cannot write %s\n", argv[2]);
            status = 2;
        }
    }
    free(table);
    free(doc);
    return status;
}
