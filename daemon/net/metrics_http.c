/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A minimal HTTP/1.1 responder for GET /metrics on the daemon's loop.
 *
 *     metrics_http_t --- listener (uv_tcp_t), render timer (uv_timer_t)
 *          `-- conns: a list (list.h), newest first, at most METRICS_HTTP_MAX_CONNS
 *                 http_conn_t: tcp + timer + request head buffer
 *
 * A connection reads its request head into a fixed buffer (READING), may
 * wait for the next render (WAITING), answers once (WRITING) and closes.
 * Its timer is the deadline of the phase it is in. Its memory goes when
 * both of its handles have closed. The responder's struct goes when the
 * listener and the render timer have closed and no connection is left, so
 * closing in any order is safe.
 */
#include "metrics_http.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kvshare_status.h"
#include "log.h"
#include "metrics_text.h"
#include "server.h"

typedef struct http_conn http_conn_t;

struct metrics_http {
    server_t *srv;
    uv_tcp_t listener;
    uv_timer_t render_timer; /* runs while scrapes wait for the next render */
    int handles_open;        /* listener and render timer */
    bool closing;
    int port;
    uint64_t next_render_ns; /* uv_hrtime before which no render starts */
    list_t conns;            /* http_conn_t.link, newest first */
};

typedef enum conn_state { CONN_READING, CONN_WAITING, CONN_WRITING } conn_state_t;

struct http_conn {
    metrics_http_t *http;
    list_node_t link; /* on metrics_http_t.conns */
    uv_tcp_t tcp;
    uv_timer_t timer;
    int handles_open;
    conn_state_t state;
    bool head_only; /* HEAD: the headers of GET, no body */
    size_t len;
    char head[METRICS_HTTP_MAX_REQUEST];
    uv_write_t write_req;
    char *reply; /* malloc'd, freed with the connection */
};

static void maybe_free_http(metrics_http_t *h)
{
    if (h->closing && h->handles_open == 0 && list_empty(&h->conns))
        free(h);
}

static void on_conn_handle_closed(uv_handle_t *handle)
{
    http_conn_t *c = handle->data;
    if (--c->handles_open > 0)
        return;
    metrics_http_t *h = c->http;
    list_remove(&h->conns, &c->link);
    free(c->reply);
    free(c);
    maybe_free_http(h);
}

static void conn_close(http_conn_t *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    if (!uv_is_closing((uv_handle_t *)&c->timer))
        uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_written(uv_write_t *req, int status)
{
    (void)status;
    conn_close(req->data);
}

static void on_timeout(uv_timer_t *timer)
{
    http_conn_t *c = timer->data;
    c->http->srv->metrics.metrics_http_closed_deadline++;
    conn_close(c);
}

/* Sends status line, headers and body (copied: the caller keeps it). With
 * head_only (HEAD), the headers say the body's length but the body is not
 * sent. The reply must be taken within METRICS_HTTP_WRITE_MS. */
static void respond_full(http_conn_t *c, int code, const char *reason, const char *body,
                         size_t body_len, const char *content_type, bool head_only)
{
    char hdr[256];
    c->state = CONN_WRITING;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_start(&c->timer, on_timeout, METRICS_HTTP_WRITE_MS, 0);
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, reason, content_type, body_len);
    if (head_only)
        body_len = 0;
    c->reply = malloc((size_t)n + body_len);
    if (!c->reply) {
        conn_close(c);
        return;
    }
    memcpy(c->reply, hdr, (size_t)n);
    if (body_len)
        memcpy(c->reply + n, body, body_len);
    uv_buf_t buf = uv_buf_init(c->reply, (unsigned)((size_t)n + body_len));
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0)
        conn_close(c);
}

static void respond_text(http_conn_t *c, int code, const char *reason, const char *text)
{
    respond_full(c, code, reason, text, strlen(text), "text/plain; charset=utf-8", false);
}

/* Renders once and answers every connection waiting for a render with it;
 * then no render starts before METRICS_HTTP_RENDER_GAP times its duration
 * has passed. */
static void render_for_waiting(metrics_http_t *h)
{
    char *body = NULL;
    size_t len = 0;
    uint64_t t0 = uv_hrtime();
    int rc = metrics_render(h->srv, &body, &len);
    uint64_t t1 = uv_hrtime(), gap = (t1 - t0) * METRICS_HTTP_RENDER_GAP;
    /* A render slower than 50 ms is a stall already: the gap stays under
     * the deadlines of the scrapes that wait. */
    h->next_render_ns = t1 + (gap < METRICS_HTTP_GAP_MAX_NS ? gap : METRICS_HTTP_GAP_MAX_NS);
    LIST_FOR_EACH (&h->conns, http_conn_t, link, c) {
        if (c->state != CONN_WAITING || uv_is_closing((uv_handle_t *)&c->tcp))
            continue;
        if (rc != 0)
            respond_text(c, 500, "Internal Server Error", "out of memory rendering metrics\n");
        else
            respond_full(c, 200, "OK", body, len, "text/plain; version=0.0.4; charset=utf-8",
                         c->head_only);
    }
    free(body);
}

static void on_render_timer(uv_timer_t *timer)
{
    render_for_waiting(timer->data);
}

/* A scrape: answered now when a render may start, else held (counted)
 * until the render timer says one may. */
static void scrape(http_conn_t *c, bool head_only)
{
    metrics_http_t *h = c->http;
    c->state = CONN_WAITING;
    c->head_only = head_only;
    uv_read_stop((uv_stream_t *)&c->tcp);
    /* The head came in time; the wait for a render is bounded by the gap. */
    uv_timer_start(&c->timer, on_timeout, METRICS_HTTP_WRITE_MS, 0);
    uint64_t now = uv_hrtime();
    if (now >= h->next_render_ns) {
        render_for_waiting(h);
        return;
    }
    h->srv->metrics.metrics_http_scrapes_held++;
    if (!uv_is_active((uv_handle_t *)&h->render_timer))
        uv_timer_start(&h->render_timer, on_render_timer,
                       (h->next_render_ns - now + 999999) / 1000000, 0);
}

/* Answers a complete request head: only its request line matters. */
static void answer(http_conn_t *c)
{
    char method[16], target[256], version[16];
    size_t line_len = 0; /* up to CR LF, or a bare LF */
    while (line_len < c->len && c->head[line_len] != '\r' && c->head[line_len] != '\n')
        line_len++;
    char line[300];
    if (line_len >= sizeof(line)) {
        respond_text(c, 414, "URI Too Long", "request line too long\n");
        return;
    }
    memcpy(line, c->head, line_len);
    line[line_len] = '\0';
    if (sscanf(line, "%15s %255s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        respond_text(c, 400, "Bad Request", "bad request line\n");
        return;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        respond_text(c, 405, "Method Not Allowed", "only GET /metrics is served\n");
        return;
    }
    /* A query string (?name[]=...) is accepted and ignored. */
    char *q = strchr(target, '?');
    if (q)
        *q = '\0';
    if (strcmp(target, "/metrics") != 0) {
        respond_text(c, 404, "Not Found", "kvshared serves GET /metrics only\n");
        return;
    }
    scrape(c, strcmp(method, "HEAD") == 0);
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    http_conn_t *c = handle->data;
    (void)suggested;
    *buf = uv_buf_init(c->head + c->len, (unsigned)(sizeof(c->head) - c->len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    http_conn_t *c = stream->data;
    (void)buf;
    if (c->state != CONN_READING)
        return;
    if (nread < 0) {
        conn_close(c);
        return;
    }
    size_t from = c->len > 2 ? c->len - 2 : 0;
    c->len += (size_t)nread;
    /* The head ends with an empty line: CR LF CR LF, or bare LFs (which
     * HTTP/1.1 lets a server accept, and some clients send). */
    for (size_t i = from; i + 1 < c->len; i++) {
        if (c->head[i] != '\n')
            continue;
        size_t j = i + 1;
        if (j < c->len && c->head[j] == '\r')
            j++;
        if (j < c->len && c->head[j] == '\n') {
            answer(c);
            return;
        }
    }
    if (c->len == sizeof(c->head))
        respond_text(c, 431, "Request Header Fields Too Large", "request head too large\n");
}

/* At the limit: the oldest connection still sending its head goes (an
 * idle one cannot keep a scraper out); when every one is being answered,
 * the new one goes. Counted either way. */
static void make_room(metrics_http_t *h, http_conn_t *fresh)
{
    http_conn_t *oldest = NULL;
    h->srv->metrics.metrics_http_closed_limit++;
    for (http_conn_t *c = LIST_NEXT(fresh, http_conn_t, link); c;
         c = LIST_NEXT(c, http_conn_t, link))
        if (c->state == CONN_READING && !uv_is_closing((uv_handle_t *)&c->tcp))
            oldest = c;
    conn_close(oldest ? oldest : fresh);
}

static void on_connection(uv_stream_t *listener, int status)
{
    metrics_http_t *h = listener->data;
    if (status < 0)
        return;
    http_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->http = h;
    uv_tcp_init(h->srv->loop, &c->tcp);
    uv_timer_init(h->srv->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles_open = 2;
    list_push_front(&h->conns, &c->link);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c);
        return;
    }
    /* Connections closing already (their handles not yet gone) do not
     * count: they hold no slot a client could use. */
    unsigned open = 0;
    LIST_FOR_EACH (&h->conns, http_conn_t, link, o)
        open += !uv_is_closing((uv_handle_t *)&o->tcp);
    if (open > METRICS_HTTP_MAX_CONNS) {
        make_room(h, c);
        if (uv_is_closing((uv_handle_t *)&c->tcp))
            return;
    }
    uv_timer_start(&c->timer, on_timeout, METRICS_HTTP_HEAD_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

int metrics_http_start(server_t *srv, const char *listen, metrics_http_t **out, char *err,
                       size_t errlen)
{
    char host[64];
    int port, rc;
    struct sockaddr_storage addr;

    if (config_parse_host_port(listen, host, sizeof(host), &port) != 0) {
        snprintf(err, errlen,
                 "--metrics-listen '%s': give HOST:PORT with a numeric address, e.g. "
                 "127.0.0.1:9464 or [::1]:9464",
                 listen ? listen : "");
        return KVS_EINVAL;
    }
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&addr) != 0)
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&addr);
    metrics_http_t *h = calloc(1, sizeof(*h));
    if (!h)
        return KVS_ENOMEM;
    h->srv = srv;
    uv_tcp_init(srv->loop, &h->listener);
    uv_timer_init(srv->loop, &h->render_timer);
    h->listener.data = h->render_timer.data = h;
    h->handles_open = 2;
    rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 2 * METRICS_HTTP_MAX_CONNS, on_connection);
    if (rc != 0) {
        snprintf(err, errlen, "cannot serve metrics on %s: %s", listen, uv_strerror(rc));
        metrics_http_close(h);
        return KVS_EIO;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    h->port = port;
    if (uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &blen) == 0)
        h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    LOG_INFO("metrics on http://%s%s%s:%d/metrics", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", h->port);
    *out = h;
    return 0;
}

int metrics_http_port(const metrics_http_t *h)
{
    return h ? h->port : 0;
}

static void on_handle_closed(uv_handle_t *handle)
{
    metrics_http_t *h = handle->data;
    h->handles_open--;
    maybe_free_http(h);
}

void metrics_http_close(metrics_http_t *h)
{
    if (!h || h->closing)
        return;
    h->closing = true;
    LIST_FOR_EACH (&h->conns, http_conn_t, link, c)
        conn_close(c);
    uv_close((uv_handle_t *)&h->listener, on_handle_closed);
    uv_close((uv_handle_t *)&h->render_timer, on_handle_closed);
}
