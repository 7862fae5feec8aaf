/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The terminal of a full-screen view (kvshare top), in plain ANSI escapes:
 * no curses, nothing beyond what every terminal emulator and tmux speak.
 *
 *   term_enter()          keys unbuffered and unechoed, the alternate screen,
 *                         cursor hidden; term_leave() (also at exit) undoes it
 *   term_size()           rows and columns now; term_resized() says SIGWINCH
 *                         came since the last call
 *   term_key(timeout)     one key, or none within the timeout (a signal, a
 *                         resize, also end the wait)
 *
 * A frame is built in a scr_t: lines of text clipped to the width (columns
 * counted, so a UTF-8 glyph counts one), attributes that take no column,
 * rows past the height dropped; scr_flush writes it at once, over the last
 * frame, so the screen never flickers.
 */
#ifndef KVSHARE_TERM_H
#define KVSHARE_TERM_H

#include <stddef.h>

/* Enters the view's terminal mode on stdin/stdout. Returns 0, or -1 when
 * stdin or stdout is not a terminal (nothing changed). */
int term_enter(void);

/* Leaves it: keys, screen and cursor as before term_enter. Safe to call
 * twice, and from exit. */
void term_leave(void);

/* The terminal's size (24 x 80 when it cannot say). */
void term_size(int *rows, int *cols);

/* 1 once after each SIGWINCH (the terminal was resized), else 0. */
int term_resized(void);

/* Waits at most timeout_ms for a key. Returns the key: a byte, or one of
 * TERM_KEY_* for the escape sequences of arrows and page keys (any other
 * sequence: TERM_KEY_OTHER); 0 when none came (timeout, a signal, a
 * resize), -1 when stdin closed. */
enum {
    TERM_KEY_OTHER = 0x100,
    TERM_KEY_UP,
    TERM_KEY_DOWN,
    TERM_KEY_PGUP,
    TERM_KEY_PGDN,
};
int term_key(int timeout_ms);

typedef enum scr_attr {
    SCR_PLAIN,
    SCR_BOLD,
    SCR_DIM,
    SCR_REVERSE, /* title and key bars */
    SCR_ALERT,   /* errors: bold red */
} scr_attr_t;

typedef struct scr {
    char *buf;
    size_t len, cap;
    int rows, cols; /* the frame's size */
    int limit;      /* rows text may use now (scr_limit), at most rows */
    int row, col;   /* where the next text goes */
    int ansi;       /* 0: plain text (no escapes), for --once */
    int failed;     /* out of memory: the frame is incomplete */
} scr_t;

/* Starts a frame of rows x cols. ansi != 0: with escapes, to draw over the
 * screen; 0: plain lines. */
void scr_begin(scr_t *s, int rows, int cols, int ansi);

/* Appends text (printf format; ASCII) to the current line, clipped. */
void scr_printf(scr_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends one glyph of one column (a UTF-8 sequence), clipped. */
void scr_glyph(scr_t *s, const char *utf8);

/* Sets the attribute of the text that follows (no column). */
void scr_attr(scr_t *s, scr_attr_t a);

/* Pads the current line with spaces to column col (for bars that span the
 * width in reverse video). */
void scr_pad(scr_t *s, int col);

/* Ends the current line: the next text goes to the next row. Rows past the
 * frame's height are dropped. */
void scr_newline(scr_t *s);

/* Lets text use the first `rows` rows of the frame only (a page keeps its
 * last row for the key bar), or all of them again with s->rows. */
void scr_limit(scr_t *s, int rows);

/* 1 while rows are left for text. */
int scr_room(const scr_t *s);

/* Writes the frame to fd (over the screen with ansi, else as lines) and
 * frees it. Returns 0 or -1 (write failed). */
int scr_flush(scr_t *s, int fd);

#endif /* KVSHARE_TERM_H */
