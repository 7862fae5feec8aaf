/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The driver of a fuzz target built without libFuzzer: runs every input file
 * named on the command line (a directory: every file in it, in name order)
 * through LLVMFuzzerTestOneInput. A broken invariant aborts, so ctest fails.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

#define REPLAY_MAX_INPUT (1u << 20)

static int run_file(const char *path)
{
    static uint8_t buf[REPLAY_MAX_INPUT];
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz replay: cannot open %s\n", path);
        return -1;
    }
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    /* A copy of exactly the input's size, so ASan and valgrind see reads
     * past its end. */
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return -1;
    memcpy(copy, buf, len);
    LLVMFuzzerTestOneInput(copy, len);
    free(copy);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    int n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz replay: no such file or directory: %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            n++;
            continue;
        }
        struct dirent **names;
        int k = scandir(argv[i], &names, NULL, by_name);
        if (k < 0)
            return 1;
        for (int j = 0; j < k; j++) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s", argv[i], names[j]->d_name);
            if (names[j]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                if (run_file(path) != 0)
                    return 1;
                n++;
            }
            free(names[j]);
        }
        free(names);
    }
    fuzz_cleanup();
    printf("%s: %d inputs replayed\n", argv[0], n);
    /* No seeds is a broken test, not a pass. */
    return n > 0 ? 0 : 1;
}
