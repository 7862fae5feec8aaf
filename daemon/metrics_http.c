/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A minimal HTTP/1.1 responder for GET /metrics on the daemon's loop.
 *
 *     metrics_http_t --- listener (uv_tcp_t)
 *          `-- conns: doubly linked, at most METRICS_HTTP_MAX_CONNS
 *                 http_conn_t: tcp + timer + request head buffer
 *
 * A connection reads its request head into a fixed buffer, answers once and
 * closes. Its memory goes when both of its handles have closed. The
 * listener's struct goes when the listener has closed and no connection is
 * left, so closing in any order is safe.
 */
#include "metrics_http.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kvshare_status.h"
#include "log.h"
#include "server.h"

typedef struct http_conn http_conn_t;

struct metrics_http {
    server_t *srv;
    uv_tcp_t listener;
    bool listener_open;
    bool closing;
    int port;
    http_conn_t *conns;
    unsigned n_conns;
};

struct http_conn {
    metrics_http_t *http;
    http_conn_t *prev, *next;
    uv_tcp_t tcp;
    uv_timer_t timer;
    int handles_open;
    bool answered;
    size_t len;
    char head[METRICS_HTTP_MAX_REQUEST];
    uv_write_t write_req;
    char *reply; /* malloc'd, freed with the connection */
};

static void maybe_free_http(metrics_http_t *h)
{
    if (h->closing && !h->listener_open && h->n_conns == 0)
        free(h);
}

static void on_conn_handle_closed(uv_handle_t *handle)
{
    http_conn_t *c = handle->data;
    if (--c->handles_open > 0)
        return;
    metrics_http_t *h = c->http;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->n_conns--;
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

/* Sends status line, headers and body (body may be NULL for a short text);
 * takes ownership of a malloc'd body. With head_only (HEAD), the headers
 * say the body's length but the body is not sent. */
static void respond_full(http_conn_t *c, int code, const char *reason, char *body, size_t body_len,
                         const char *content_type, bool head_only)
{
    char hdr[256];
    c->answered = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->timer);
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, reason, content_type, body_len);
    c->reply = malloc((size_t)n + body_len);
    if (!c->reply) {
        free(body);
        conn_close(c);
        return;
    }
    memcpy(c->reply, hdr, (size_t)n);
    if (head_only)
        body_len = 0;
    if (body_len)
        memcpy(c->reply + n, body, body_len);
    free(body);
    uv_buf_t buf = uv_buf_init(c->reply, (unsigned)((size_t)n + body_len));
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0)
        conn_close(c);
}

static void respond(http_conn_t *c, int code, const char *reason, char *body, size_t body_len,
                    const char *content_type)
{
    respond_full(c, code, reason, body, body_len, content_type, false);
}

static void respond_text(http_conn_t *c, int code, const char *reason, const char *text)
{
    size_t len = strlen(text);
    char *body = malloc(len + 1);
    if (!body) {
        conn_close(c);
        return;
    }
    memcpy(body, text, len + 1);
    respond(c, code, reason, body, len, "text/plain; charset=utf-8");
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
    char *body = NULL;
    size_t len = 0;
    if (metrics_render(c->http->srv, &body, &len) != 0) {
        respond_text(c, 500, "Internal Server Error", "out of memory rendering metrics\n");
        return;
    }
    respond_full(c, 200, "OK", body, len, "text/plain; version=0.0.4; charset=utf-8",
                 strcmp(method, "HEAD") == 0);
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
    if (c->answered)
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

static void on_timeout(uv_timer_t *timer)
{
    conn_close(timer->data);
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
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->n_conns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0 || h->n_conns > METRICS_HTTP_MAX_CONNS) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timeout, METRICS_HTTP_TIMEOUT_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close(c);
}

int metrics_http_parse_addr(const char *listen, char *host, size_t hostlen, int *port)
{
    if (!listen || !host || !port)
        return KVS_EINVAL;
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen || !colon[1])
        return KVS_EINVAL;
    const char *h = listen;
    size_t hl = (size_t)(colon - listen);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return KVS_EINVAL;
        h++;
        hl -= 2;
    }
    if (hl >= hostlen)
        return KVS_EINVAL;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535)
        return KVS_EINVAL;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    if (uv_ip4_addr(host, *port, &a4) != 0 && uv_ip6_addr(host, *port, &a6) != 0)
        return KVS_EINVAL;
    return 0;
}

int metrics_http_start(server_t *srv, const char *listen, metrics_http_t **out, char *err,
                       size_t errlen)
{
    char host[64];
    int port, rc;
    struct sockaddr_storage addr;

    if (metrics_http_parse_addr(listen, host, sizeof(host), &port) != 0) {
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
    h->listener.data = h;
    h->listener_open = true;
    rc = uv_tcp_bind(&h->listener, (struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&h->listener, 16, on_connection);
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

static void on_listener_closed(uv_handle_t *handle)
{
    metrics_http_t *h = handle->data;
    h->listener_open = false;
    maybe_free_http(h);
}

void metrics_http_close(metrics_http_t *h)
{
    if (!h || h->closing)
        return;
    h->closing = true;
    for (http_conn_t *c = h->conns; c; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&h->listener, on_listener_closed);
}
