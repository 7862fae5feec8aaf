/* SPDX-License-Identifier: Apache-2.0 */
#include "term.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

static struct termios saved_tio;
static int entered;
static volatile sig_atomic_t winch;

static void on_winch(int sig)
{
    (void)sig;
    winch = 1;
}

static void put(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

int term_enter(void)
{
    if (entered)
        return 0;
    if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO) || tcgetattr(STDIN_FILENO, &saved_tio))
        return -1;
    struct termios t = saved_tio;
    /* Keys one by one, unechoed; ISIG stays, so Ctrl-C still interrupts and
     * output processing stays, so "\n" still returns the carriage. */
    t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &t))
        return -1;
    /* No SA_RESTART: a resize ends the wait in term_key at once. */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_winch;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGWINCH, &sa, NULL);
    entered = 1;
    atexit(term_leave);
    put("\033[?1049h\033[?25l\033[H\033[2J");
    return 0;
}

void term_leave(void)
{
    if (!entered)
        return;
    entered = 0;
    put("\033[m\033[?25h\033[?1049l");
    tcsetattr(STDIN_FILENO, TCSANOW, &saved_tio);
    signal(SIGWINCH, SIG_DFL);
}

void term_size(int *rows, int *cols)
{
    struct winsize ws;
    *rows = 24;
    *cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

int term_resized(void)
{
    if (!winch)
        return 0;
    winch = 0;
    return 1;
}

int term_key(int timeout_ms)
{
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms < 0 ? 0 : timeout_ms);
    if (r <= 0)
        return 0; /* timeout, or EINTR: a signal (resize, Ctrl-C) */
    unsigned char c;
    ssize_t n = read(STDIN_FILENO, &c, 1);
    if (n == 0)
        return -1;
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 0 : -1;
    if (c != 27)
        return c;
    /* An escape sequence arrives in one burst: read it whole. */
    char seq[8];
    size_t len = 0;
    while (poll(&p, 1, 10) > 0 && read(STDIN_FILENO, &c, 1) == 1)
        if (len < sizeof(seq) - 1)
            seq[len++] = (char)c;
    seq[len] = '\0';
    if (len == 0)
        return 27;
    static const struct {
        const char *seq;
        int key;
    } keys[] = {{"[A", TERM_KEY_UP},   {"OA", TERM_KEY_UP},    {"[B", TERM_KEY_DOWN},
                {"OB", TERM_KEY_DOWN}, {"[5~", TERM_KEY_PGUP}, {"[6~", TERM_KEY_PGDN}};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (strcmp(seq, keys[i].seq) == 0)
            return keys[i].key;
    return TERM_KEY_OTHER;
}

/* ---- frames ---------------------------------------------------------------------- */

static void raw_append(scr_t *s, const char *text, size_t n)
{
    if (s->failed)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 8192;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *b = realloc(s->buf, cap);
        if (!b) {
            s->failed = 1;
            return;
        }
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, n);
    s->len += n;
    s->buf[s->len] = '\0';
}

void scr_begin(scr_t *s, int rows, int cols, int ansi)
{
    memset(s, 0, sizeof(*s));
    s->rows = rows > 0 ? rows : 1;
    s->cols = cols > 0 ? cols : 1;
    s->limit = s->rows;
    s->ansi = ansi;
    if (ansi)
        raw_append(s, "\033[H", 3);
}

void scr_limit(scr_t *s, int rows)
{
    s->limit = rows < 0 ? 0 : rows > s->rows ? s->rows : rows;
}

int scr_room(const scr_t *s)
{
    return s->row < s->limit;
}

void scr_printf(scr_t *s, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (n < 0 || !scr_room(s))
        return;
    size_t len = (size_t)n < sizeof(text) ? (size_t)n : sizeof(text) - 1;
    size_t fit = s->col >= s->cols ? 0 : (size_t)(s->cols - s->col);
    if (len > fit)
        len = fit;
    raw_append(s, text, len);
    s->col += (int)len;
}

void scr_glyph(scr_t *s, const char *utf8)
{
    if (!scr_room(s) || s->col >= s->cols)
        return;
    raw_append(s, utf8, strlen(utf8));
    s->col++;
}

void scr_attr(scr_t *s, scr_attr_t a)
{
    static const char *const esc[] = {
        [SCR_PLAIN] = "\033[m",           [SCR_BOLD] = "\033[m\033[1m",
        [SCR_DIM] = "\033[m\033[2m",      [SCR_REVERSE] = "\033[m\033[7m",
        [SCR_ALERT] = "\033[m\033[1;31m",
    };
    if (s->ansi && scr_room(s))
        raw_append(s, esc[a], strlen(esc[a]));
}

void scr_pad(scr_t *s, int col)
{
    while (scr_room(s) && s->col < col && s->col < s->cols)
        scr_printf(s, " ");
}

void scr_newline(scr_t *s)
{
    if (!scr_room(s))
        return;
    if (s->ansi)
        raw_append(s, "\033[m\033[K", 6);
    s->row++;
    s->col = 0;
    /* No line feed after the last row: it would scroll the screen. */
    if (s->row < s->rows || !s->ansi)
        raw_append(s, s->ansi ? "\r\n" : "\n", s->ansi ? 2 : 1);
}

int scr_flush(scr_t *s, int fd)
{
    if (s->ansi) {
        if (s->col > 0)
            scr_newline(s);
        raw_append(s, "\033[m\033[J", 6);
    }
    int rc = s->failed ? -1 : 0;
    for (size_t off = 0; rc == 0 && off < s->len;) {
        ssize_t w = write(fd, s->buf + off, s->len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = -1;
        else
            off += (size_t)w;
    }
    free(s->buf);
    memset(s, 0, sizeof(*s));
    return rc;
}
