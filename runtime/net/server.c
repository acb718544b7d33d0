/* server.c — the HTTP front of `clrt serve`, on libmicrohttpd.
 *
 * MHD runs one thread per connection. Each request is queued for the engine (the Lua main
 * loop, which owns the model and batches every request into the same decode steps) and the
 * connection thread waits until the engine answers: either a whole body, or a stream that the
 * engine writes chunk by chunk (server-sent events). The engine never blocks on a socket, and
 * a client that goes away is seen by the engine as a closed request on its next write. */
#include "clrt.h"
#include "front_door.h"

#include <microhttpd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum { REQ_QUEUED, REQ_TAKEN, REQ_ANSWERED };

typedef struct server_request {
  int64_t id;
  int refcount;                 /* the connection thread and the engine each hold one */
  int state;
  int closed;                   /* the client is gone or the response is complete */
  int too_large;
  char method[16];
  char *path;
  char *authorization;
  char *body;
  size_t body_len, body_cap;
  /* the answer */
  int status;
  char content_type[64];
  int streaming, stream_ended;
  char *out;                    /* whole body, or stream bytes not yet sent */
  size_t out_len, out_cap, out_sent;
  struct clrt_server *server;
  struct server_request *next_queued;
  struct server_request *next_live;
  /* This request's answer or stream bytes arrived. One per request: a shared one woke every
     connection thread on every token of every stream (32 streams: 1024 wake-ups a step). */
  pthread_cond_t cv;
} server_request;

/* An open connection, watched until its first request head is complete: a slow-loris client
   that trickles a header byte at a time defeats an idle timeout, not this deadline. */
typedef struct server_conn {
  int fd;
  int head_done;
  struct timespec opened;
  struct server_conn *next;
} server_conn;

struct clrt_server {
  struct MHD_Daemon *daemon;
  front_door *door;             /* the listening socket: MHD sees a connection once its first line is a request line */
  server_conn *conns;           /* every open connection */
  int connections;              /* how many */
  int max_connections, header_timeout_s;
  pthread_t watchdog;
  int watchdog_started;
  pthread_mutex_t mu;
  pthread_cond_t engine_cv;     /* a request was queued */
  pthread_cond_t conn_cv;       /* a connection completed (what stop waits for) */
  server_request *queue_head, *queue_tail;
  server_request *live;         /* every request the engine may still refer to */
  int64_t next_id;
  size_t max_body;
  int stopping;
  int port;
  server_request *taken;        /* the request last handed out by clrt_server_next */
};

static void req_release_locked(clrt_server *s, server_request *r) {
  if (--r->refcount > 0) return;
  for (server_request **p = &s->live; *p; p = &(*p)->next_live)
    if (*p == r) {
      *p = r->next_live;
      break;
    }
  free(r->path);
  free(r->authorization);
  free(r->body);
  free(r->out);
  pthread_cond_destroy(&r->cv);
  free(r);
}

static server_request *find_locked(clrt_server *s, int64_t id) {
  for (server_request *r = s->live; r; r = r->next_live)
    if (r->id == id) return r;
  return NULL;
}

static int append(char **buf, size_t *len, size_t *cap, const char *data, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t c = *cap ? *cap : 256;
    while (c < *len + n + 1) c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return -1;
    *buf = p;
    *cap = c;
  }
  memcpy(*buf + *len, data, n);
  *len += n;
  (*buf)[*len] = 0;
  return 0;
}

/* A readable socket with nothing to read means the peer closed it. */
static int peer_hung_up(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void deadline_in(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* MHD pulls stream bytes from here on the connection's own thread; waiting is allowed there. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  server_request *r = cls;
  clrt_server *s = r->server;
  pthread_mutex_lock(&s->mu);
  while (r->out_sent == r->out_len && !r->stream_ended && !s->stopping) {
    struct timespec ts;
    deadline_in(&ts, 200);
    pthread_cond_timedwait(&r->cv, &s->mu, &ts);
  }
  ssize_t n;
  if (r->out_sent < r->out_len) {
    size_t avail = r->out_len - r->out_sent;
    n = (ssize_t)(avail < max ? avail : max);
    memcpy(buf, r->out + r->out_sent, (size_t)n);
    r->out_sent += (size_t)n;
  } else {
    n = s->stopping && !r->stream_ended ? MHD_CONTENT_READER_END_WITH_ERROR
                                        : MHD_CONTENT_READER_END_OF_STREAM;
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

/* OpenAI's error shape: {error: {message, type, param, code}}, code a string. */
static enum MHD_Result send_json_error(struct MHD_Connection *c, unsigned status,
                                       const char *code, const char *message) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
           "\"code\":\"%s\"}}",
           message, code);
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(resp, "Content-Type", "application/json");
  enum MHD_Result ret = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* Connections come and go: counted for the overall limit, watched for the header deadline.
   MHD calls CLOSED before it closes the socket, so a watched fd is always still open. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  clrt_server *s = cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    server_conn *c = calloc(1, sizeof *c);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    pthread_mutex_lock(&s->mu);
    s->connections++;
    if (c) {
      c->fd = ci ? ci->connect_fd : -1;
      clock_gettime(CLOCK_MONOTONIC, &c->opened);
      c->next = s->conns;
      s->conns = c;
    }
    pthread_mutex_unlock(&s->mu);
    *socket_context = c;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    server_conn *c = *socket_context;
    pthread_mutex_lock(&s->mu);
    s->connections--;
    for (server_conn **p = &s->conns; c && *p; p = &(*p)->next)
      if (*p == c) {
        *p = c->next;
        break;
      }
    pthread_mutex_unlock(&s->mu);
    free(c);
    *socket_context = NULL;
  }
}

/* Once a second: shut down connections whose first request head is overdue (their thread then
   sees the socket end and MHD closes it). */
static void *watchdog_main(void *arg) {
  clrt_server *s = arg;
  pthread_mutex_lock(&s->mu);
  while (!s->stopping) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (server_conn *c = s->conns; c; c = c->next)
      if (!c->head_done && c->fd >= 0 && now.tv_sec - c->opened.tv_sec >= s->header_timeout_s) {
        shutdown(c->fd, SHUT_RDWR);
        c->fd = -1;   /* once */
      }
    struct timespec ts;
    deadline_in(&ts, 500);
    pthread_cond_timedwait(&s->conn_cv, &s->mu, &ts);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* RFC 9112 section 6.3: a message with Content-Length values that differ is invalid. */
typedef struct { const char *first; int differ; } length_check;
static enum MHD_Result each_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                   const char *value) {
  (void)kind;
  length_check *lc = cls;
  if (key && value && strcasecmp(key, "Content-Length") == 0) {
    if (!lc->first)
      lc->first = value;
    else if (strcmp(lc->first, value) != 0)
      lc->differ = 1;
  }
  return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  (void)version;
  clrt_server *s = cls;
  server_request *r = *con_cls;
  if (!r) {
    /* the request head is complete: the header deadline no longer applies */
    const union MHD_ConnectionInfo *sc =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    pthread_mutex_lock(&s->mu);
    if (sc && sc->socket_context) ((server_conn *)sc->socket_context)->head_done = 1;
    int busy = s->connections > s->max_connections;
    pthread_mutex_unlock(&s->mu);
    length_check lc = {NULL, 0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, each_header, &lc);
    if (lc.differ)
      return send_json_error(conn, 400, "invalid_request_error",
                             "two different Content-Length headers (RFC 9112 section 6.3)");
    if (busy) {
      char why[160];
      snprintf(why, sizeof why,
               "server busy: more than %d open connections (clrt serve --max-connections)",
               s->max_connections);
      return send_json_error(conn, 503, "server_busy", why);
    }
    r = calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->server = s;
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->method, sizeof r->method, "%s", method);
    r->path = strdup(url);
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    r->authorization = auth ? strdup(auth) : NULL;
    pthread_mutex_lock(&s->mu);
    r->id = ++s->next_id;
    r->refcount = 1;   /* the connection's */
    r->next_live = s->live;
    s->live = r;
    pthread_mutex_unlock(&s->mu);
    *con_cls = r;
    return MHD_YES;
  }
  if (*upload_data_size) {
    if (r->body_len + *upload_data_size > s->max_body)
      r->too_large = 1;
    else if (append(&r->body, &r->body_len, &r->body_cap, upload_data, *upload_data_size))
      return MHD_NO;
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (r->too_large) {
    char why[128];
    snprintf(why, sizeof why, "request body too large: more than %zu bytes (clrt serve --max-body)",
             s->max_body);
    return send_json_error(conn, 413, "request_too_large", why);
  }
  if (!r->body && append(&r->body, &r->body_len, &r->body_cap, "", 0)) return MHD_NO;

  /* Hand the request to the engine and wait for its answer. */
  pthread_mutex_lock(&s->mu);
  r->refcount++;   /* the engine's */
  r->state = REQ_QUEUED;
  r->next_queued = NULL;
  if (s->queue_tail)
    s->queue_tail->next_queued = r;
  else
    s->queue_head = r;
  s->queue_tail = r;
  pthread_cond_broadcast(&s->engine_cv);
  /* While the engine works, notice a client that hangs up so its rows can be dropped. */
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  int fd = ci ? ci->connect_fd : -1;
  while (r->state != REQ_ANSWERED && !s->stopping) {
    struct timespec ts;
    deadline_in(&ts, 100);
    pthread_cond_timedwait(&r->cv, &s->mu, &ts);
    if (fd >= 0 && !r->closed && peer_hung_up(fd)) r->closed = 1;
  }
  int stopping = s->stopping && r->state != REQ_ANSWERED;
  pthread_mutex_unlock(&s->mu);
  if (stopping) return send_json_error(conn, 503, "server_shutting_down", "server is shutting down");

  struct MHD_Response *resp;
  if (r->streaming) {
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, r, NULL);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
  } else {
    resp = MHD_create_response_from_buffer(r->out_len, r->out ? r->out : "",
                                           MHD_RESPMEM_MUST_COPY);
  }
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, "Content-Type", r->content_type);
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)r->status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode code) {
  (void)conn;
  (void)code;
  clrt_server *s = cls;
  server_request *r = *con_cls;
  if (!r) return;
  pthread_mutex_lock(&s->mu);
  r->closed = 1;
  req_release_locked(s, r);
  pthread_cond_broadcast(&s->conn_cv);
  pthread_mutex_unlock(&s->mu);
  *con_cls = NULL;
}

clrt_server *clrt_server_start(const char *host, int port, const clrt_server_limits *limits) {
  clrt_server_limits lim = {0};
  if (limits) lim = *limits;
  if (!lim.max_body) lim.max_body = (size_t)1 << 20;
  if (lim.header_timeout_s <= 0) lim.header_timeout_s = 10;
  if (lim.idle_timeout_s <= 0) lim.idle_timeout_s = 60;
  if (lim.max_connections <= 0) lim.max_connections = 256;
  if (lim.max_per_client <= 0) lim.max_per_client = 32;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host ? host : "127.0.0.1", &addr.sin_addr) != 1) {
    clrt_set_error("serve: '%s' is not an IPv4 address", host);
    return NULL;
  }
  clrt_server *s = calloc(1, sizeof *s);
  if (!s) {
    clrt_set_error("serve: out of memory");
    return NULL;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->engine_cv, NULL);
  pthread_cond_init(&s->conn_cv, NULL);
  s->max_body = lim.max_body;
  s->max_connections = lim.max_connections;
  s->header_timeout_s = lim.header_timeout_s;
  /* poll, not select: select stops at FD_SETSIZE (1024) descriptors. MHD itself refuses
     connections past the per-client limit and past the overall one plus a margin; within the
     margin a request gets a 503 that says why. The front door (front_door.c) listens and hands
     connections over, with the same limits for those still waiting for their first line. */
  s->daemon = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
          MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC,
      0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
      s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)lim.idle_timeout_s,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)(lim.max_connections + 64),
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)lim.max_per_client,
      MHD_OPTION_THREAD_STACK_SIZE, (size_t)512 * 1024, MHD_OPTION_STRICT_FOR_CLIENT, (int)1,
      MHD_OPTION_END);
  if (s->daemon)
    s->door = front_door_start(&addr, s->daemon, lim.max_connections + 64, lim.max_per_client,
                               lim.header_timeout_s, &s->port);
  if (!s->door) {
    clrt_set_error("serve: cannot listen on %s:%d (address in use or not permitted)",
                   host ? host : "127.0.0.1", port);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return NULL;
  }
  s->watchdog_started = pthread_create(&s->watchdog, NULL, watchdog_main, s) == 0;
  return s;
}

int clrt_server_port(const clrt_server *s) { return s->port; }

int clrt_server_next(clrt_server *s, int timeout_ms, clrt_server_request_info *out) {
  pthread_mutex_lock(&s->mu);
  if (s->taken) {   /* the previous request's strings were valid until now */
    req_release_locked(s, s->taken);
    s->taken = NULL;
  }
  if (!s->queue_head && timeout_ms > 0) {
    struct timespec ts;
    deadline_in(&ts, timeout_ms);
    while (!s->queue_head && !s->stopping)
      if (pthread_cond_timedwait(&s->engine_cv, &s->mu, &ts)) break;
  }
  server_request *r = s->queue_head;
  if (!r) {
    pthread_mutex_unlock(&s->mu);
    return 0;
  }
  s->queue_head = r->next_queued;
  if (!s->queue_head) s->queue_tail = NULL;
  r->state = REQ_TAKEN;
  r->refcount++;   /* keeps the strings below alive until the next call */
  s->taken = r;
  out->id = r->id;
  out->method = r->method;
  out->path = r->path;
  out->authorization = r->authorization;
  out->body = r->body;
  out->body_len = r->body_len;
  pthread_mutex_unlock(&s->mu);
  return 1;
}

/* The engine's reference is dropped when it has said everything it will say. */
static server_request *engine_request(clrt_server *s, int64_t id, const char *op) {
  server_request *r = find_locked(s, id);
  if (!r || r->state == REQ_QUEUED) {
    clrt_set_error("serve: %s: no open request %lld", op, (long long)id);
    return NULL;
  }
  return r;
}

int clrt_server_respond(clrt_server *s, int64_t id, int status, const char *content_type,
                        const char *body, size_t len) {
  pthread_mutex_lock(&s->mu);
  server_request *r = engine_request(s, id, "respond");
  if (!r || r->state == REQ_ANSWERED) {
    if (r) clrt_set_error("serve: respond: request %lld was already answered", (long long)id);
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  r->status = status;
  snprintf(r->content_type, sizeof r->content_type, "%s", content_type);
  r->out_len = 0;
  int rc = append(&r->out, &r->out_len, &r->out_cap, body, len);
  r->state = REQ_ANSWERED;
  pthread_cond_broadcast(&r->cv);
  req_release_locked(s, r);
  pthread_mutex_unlock(&s->mu);
  if (rc) clrt_set_error("serve: out of memory for a %zu-byte response", len);
  return rc;
}

int clrt_server_stream_begin(clrt_server *s, int64_t id, int status, const char *content_type) {
  pthread_mutex_lock(&s->mu);
  server_request *r = engine_request(s, id, "stream_begin");
  if (!r || r->state == REQ_ANSWERED) {
    if (r) clrt_set_error("serve: stream_begin: request %lld was already answered", (long long)id);
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  r->status = status;
  snprintf(r->content_type, sizeof r->content_type, "%s", content_type);
  r->streaming = 1;
  r->state = REQ_ANSWERED;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

int clrt_server_stream_write(clrt_server *s, int64_t id, const char *data, size_t len) {
  pthread_mutex_lock(&s->mu);
  server_request *r = find_locked(s, id);
  int rc = 0;
  if (!r || !r->streaming || r->stream_ended) {
    clrt_set_error("serve: stream_write: request %lld is not an open stream", (long long)id);
    rc = -1;
  } else if (r->closed) {
    clrt_set_error("serve: stream_write: the client of request %lld disconnected", (long long)id);
    rc = 1;
  } else {
    /* Drop what was sent already so a long stream does not grow its buffer forever. */
    if (r->out_sent > 0 && r->out_sent == r->out_len) r->out_sent = r->out_len = 0;
    if (append(&r->out, &r->out_len, &r->out_cap, data, len)) {
      clrt_set_error("serve: out of memory");
      rc = -1;
    }
    pthread_cond_broadcast(&r->cv);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int clrt_server_stream_end(clrt_server *s, int64_t id) {
  pthread_mutex_lock(&s->mu);
  server_request *r = find_locked(s, id);
  if (!r || !r->streaming || r->stream_ended) {
    clrt_set_error("serve: stream_end: request %lld is not an open stream", (long long)id);
    pthread_mutex_unlock(&s->mu);
    return -1;
  }
  r->stream_ended = 1;
  pthread_cond_broadcast(&r->cv);
  req_release_locked(s, r);
  pthread_mutex_unlock(&s->mu);
  return 0;
}

int clrt_server_is_open(clrt_server *s, int64_t id) {
  pthread_mutex_lock(&s->mu);
  server_request *r = find_locked(s, id);
  int open = r && !r->closed;
  pthread_mutex_unlock(&s->mu);
  return open;
}

void clrt_server_stop(clrt_server *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  /* Let answers already given reach their clients (up to 2 s) before closing sockets. */
  struct timespec until;
  deadline_in(&until, 2000);
  for (;;) {
    int pending = 0;
    for (server_request *r = s->live; r; r = r->next_live)
      if (!r->closed && r->state == REQ_ANSWERED && (!r->streaming || r->stream_ended)) pending = 1;
    if (!pending || pthread_cond_timedwait(&s->conn_cv, &s->mu, &until)) break;
  }
  s->stopping = 1;
  pthread_cond_broadcast(&s->conn_cv);
  for (server_request *r = s->live; r; r = r->next_live) pthread_cond_broadcast(&r->cv);
  pthread_cond_broadcast(&s->engine_cv);
  pthread_mutex_unlock(&s->mu);
  if (s->watchdog_started) pthread_join(s->watchdog, NULL);
  front_door_stop(s->door);     /* no new connection reaches MHD from here */
  MHD_stop_daemon(s->daemon);   /* joins every connection thread */
  /* What the engine still held is no longer reachable by anyone. */
  while (s->live) {
    server_request *r = s->live;
    s->live = r->next_live;
    free(r->path);
    free(r->authorization);
    free(r->body);
    free(r->out);
    pthread_cond_destroy(&r->cv);
    free(r);
  }
  pthread_cond_destroy(&s->conn_cv);
  pthread_cond_destroy(&s->engine_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
