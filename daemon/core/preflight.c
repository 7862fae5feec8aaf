/* SPDX-License-Identifier: Apache-2.0 */
#include "preflight.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvshare_status.h"
#include "disk.h"

int preflight_parse_devices(const char *spec, int *ordinals, uint32_t *n, bool *all, char *err,
                            size_t errlen)
{
    *n = 0;
    *all = strcmp(spec, "all") == 0;
    if (*all)
        return 0;
    const char *p = spec;
    while (*p) {
        char *end;
        unsigned long a = strtoul(p, &end, 10), b;
        if (end == p || a > 1023)
            goto bad;
        b = a;
        if (*end == '-') {
            p = end + 1;
            b = strtoul(p, &end, 10);
            if (end == p || b > 1023 || b < a)
                goto bad;
        }
        for (unsigned long d = a; d <= b; d++) {
            for (uint32_t k = 0; k < *n; k++)
                if (ordinals[k] == (int)d)
                    goto bad;
            if (*n == SERVER_MAX_DEVICES)
                goto bad;
            ordinals[(*n)++] = (int)d;
        }
        if (*end == ',')
            end++;
        else if (*end)
            goto bad;
        p = end;
    }
    if (*n > 0)
        return 0;
bad:
    snprintf(err, errlen,
             "--devices %s: give a range (0-3), a list (0,2,5), or all; each device once, at "
             "most %d, ordinals up to 1023",
             spec, SERVER_MAX_DEVICES);
    return KVS_EINVAL;
}

/* The devices --devices names: 1 without it, 0 for "all" (known at start). */
static int device_count(const server_config_t *cfg, uint32_t *n, char *err, size_t errlen)
{
    int ordinals[SERVER_MAX_DEVICES];
    bool all = false;
    *n = 1;
    if (!cfg->devices)
        return 0;
    return preflight_parse_devices(cfg->devices, ordinals, n, &all, err, errlen);
}

static int check_devices(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    (void)uid;
    uint32_t n;
    return device_count(cfg, &n, err, errlen);
}

/* The disk and cluster tiers move one device's bytes of a block: with
 * several devices they would keep a block without its other shards (with
 * --devices all, start checks once it has counted them). */
static int check_tiers_one_device(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    (void)uid;
    uint32_t n;
    if (device_count(cfg, &n, err, errlen) != 0 || n <= 1 ||
        !(cfg->disk_tier_path || cfg->cluster_seeds))
        return 0;
    snprintf(err, errlen,
             "%s with several devices is not supported yet: it would keep one shard of each "
             "block; give one device, or leave it off",
             cfg->disk_tier_path ? "a disk tier (disk_tier_path)" : "the cluster tier");
    return KVS_EINVAL;
}

static int check_disk_tier(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    (void)uid;
    if (!cfg->disk_tier_path)
        return 0;
    if (cfg->disk_tier_bytes == 0) {
        snprintf(err, errlen, "disk_tier_path is set without disk_tier_bytes");
        return KVS_EINVAL;
    }
    if (cfg->host_tier_bytes == 0) {
        snprintf(err, errlen,
                 "disk_tier_path needs a host tier: blocks reach the disk from host memory; give "
                 "host_tier (--host-tier) too");
        return KVS_EINVAL;
    }
    return 0;
}

static int check_disk_path(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    return cfg->disk_tier_path ? disk_check_path(cfg->disk_tier_path, uid, err, errlen) : 0;
}

/* The cluster's password: a small regular file (the client reads its
 * first PREFLIGHT_AUTH_MAX bytes: more would be cut silently) of uid or
 * root, that only they (and its group, to read) can use. */
static int check_auth_file(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    const char *path = cfg->cluster_auth_file;
    if (!path)
        return 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cluster_auth_file: cannot open %s: %s", path, strerror(errno));
        return KVS_EINVAL;
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : KVS_EINVAL;
    close(fd);
    if (rc != 0) {
        snprintf(err, errlen, "cluster_auth_file: cannot stat %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen,
                 "cluster_auth_file: %s is not a regular file (mode %06o): give the file that "
                 "holds the password",
                 path, (unsigned)st.st_mode);
        rc = KVS_EINVAL;
    } else if (st.st_size == 0 || st.st_size > PREFLIGHT_AUTH_MAX) {
        snprintf(err, errlen,
                 "cluster_auth_file: %s holds %lld bytes: give one or two lines of at most %d "
                 "bytes in all (a password, or a user and a password)",
                 path, (long long)st.st_size, PREFLIGHT_AUTH_MAX);
        rc = KVS_EINVAL;
    } else if (uid != DISK_ANY_UID && st.st_uid != uid && st.st_uid != 0) {
        snprintf(err, errlen,
                 "cluster_auth_file: %s (owner uid %u, mode %04o) belongs neither to kvshared's "
                 "uid %u nor to root: its owner could change the password kvshared sends",
                 path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)uid);
        rc = KVS_EDENIED;
    } else if (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) {
        snprintf(err, errlen,
                 "cluster_auth_file: %s (owner uid %u, mode %04o) can be %s by %s: it holds "
                 "the cluster's password; chmod o-rw,g-w it",
                 path, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                 (st.st_mode & (S_IWOTH | S_IWGRP)) ? "written" : "read",
                 (st.st_mode & (S_IROTH | S_IWOTH)) ? "every user" : "its group");
        rc = KVS_EDENIED;
    }
    return rc;
}

const preflight_check_t preflight_checks[] = {
    {"devices", check_devices},
    {"disk_tier_path, disk_tier_bytes, host_tier", check_disk_tier},
    {"disk_tier_path, cluster_seeds with devices", check_tiers_one_device},
    {"disk_tier_path (the file and its directories)", check_disk_path},
    {"cluster_auth_file", check_auth_file},
};
const size_t preflight_count = sizeof(preflight_checks) / sizeof(preflight_checks[0]);

int preflight_run(const server_config_t *cfg, uid_t uid, char *err, size_t errlen)
{
    for (size_t i = 0; i < preflight_count; i++) {
        int rc = preflight_checks[i].run(cfg, uid, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}
