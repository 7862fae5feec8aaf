/* SPDX-License-Identifier: Apache-2.0 */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvshare_status.h"

typedef struct unit {
    const char *name;
    double scale;
} unit_t;

static const char *skip_space(const char *s)
{
    while (*s != '\0' && isspace((unsigned char)*s))
        s++;
    return s;
}

/* A non-negative decimal number followed by one of units (matched without
 * case, spaces allowed around it), scaled and rounded to a whole number. */
static int parse_scaled(const char *text, const unit_t *units, size_t n_units, uint64_t *out)
{
    if (text == NULL || out == NULL)
        return KVS_EINVAL;
    const char *s = skip_space(text);
    /* strtod would accept "inf", "nan", hex and a sign: allow digits and one dot only. */
    if (!isdigit((unsigned char)*s) && *s != '.')
        return KVS_EINVAL;
    char *end = NULL;
    errno = 0;
    double value = strtod(s, &end);
    if (errno != 0 || end == s || !isfinite(value) || value < 0)
        return KVS_EINVAL;
    for (const char *p = s; p < end; p++)
        if (!isdigit((unsigned char)*p) && *p != '.')
            return KVS_EINVAL;
    const char *unit = skip_space(end);
    size_t ulen = strlen(unit);
    while (ulen > 0 && isspace((unsigned char)unit[ulen - 1]))
        ulen--;
    for (size_t i = 0; i < n_units; i++) {
        if (strlen(units[i].name) != ulen || strncasecmp(unit, units[i].name, ulen) != 0)
            continue;
        double scaled = value * units[i].scale;
        if (scaled >= 18446744073709551616.0) /* 2^64 */
            return KVS_EINVAL;
        /* Round to the nearest unit: "1.1GB" is 1100000000, not 1099999999. */
        *out = (uint64_t)(scaled + 0.5);
        return 0;
    }
    return KVS_EINVAL;
}

int units_parse_bytes(const char *text, uint64_t *out)
{
    static const unit_t units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1e3},
        {"kb", 1e3},
        {"m", 1e6},
        {"mb", 1e6},
        {"g", 1e9},
        {"gb", 1e9},
        {"t", 1e12},
        {"tb", 1e12},
        {"kib", 1024.0},
        {"mib", 1048576.0},
        {"gib", 1073741824.0},
        {"tib", 1099511627776.0},
    };
    return parse_scaled(text, units, sizeof(units) / sizeof(units[0]), out);
}

int units_parse_ms(const char *text, uint64_t bare_unit_ms, uint64_t *out)
{
    const unit_t units[] = {
        {"", (double)bare_unit_ms}, {"ms", 1}, {"s", 1e3}, {"m", 60e3}, {"h", 3600e3},
    };
    if (bare_unit_ms == 0)
        return KVS_EINVAL;
    return parse_scaled(text, units, sizeof(units) / sizeof(units[0]), out);
}

int units_parse_count(const char *text, uint64_t *out)
{
    if (text == NULL || out == NULL)
        return KVS_EINVAL;
    const char *s = skip_space(text);
    if (!isdigit((unsigned char)*s))
        return KVS_EINVAL;
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return KVS_EINVAL;
    uint64_t scale = 1;
    if (*end == 'k' || *end == 'K') {
        scale = 1024;
        end++;
    } else if (*end == 'm' || *end == 'M') {
        scale = 1024 * 1024;
        end++;
    }
    if (*skip_space(end) != '\0' || value == 0 || value > UINT64_MAX / scale)
        return KVS_EINVAL;
    *out = (uint64_t)value * scale;
    return 0;
}

const char *units_format_bytes(uint64_t bytes, int decimals, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    size_t u = 0;
    if (buf == NULL || len == 0)
        return buf;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else if (v == (double)(uint64_t)v) /* whole: no libm needed, v < 2^64 */
        snprintf(buf, len, "%.0f %s", v, units[u]);
    else
        snprintf(buf, len, "%.*f %s", decimals, v, units[u]);
    return buf;
}

const char *units_format_ms(uint64_t ms, char *buf, size_t len)
{
    unsigned long long s = ms / 1000;
    if (buf == NULL || len == 0)
        return buf;
    if (s >= 86400)
        snprintf(buf, len, "%llud%02lluh", s / 86400, s % 86400 / 3600);
    else if (s >= 3600)
        snprintf(buf, len, "%lluh%02llum", s / 3600, s % 3600 / 60);
    else if (s >= 60)
        snprintf(buf, len, "%llum%02llus", s / 60, s % 60);
    else
        snprintf(buf, len, "%llus", s);
    return buf;
}
