/* front_door.c — `clrt serve`'s listening socket, in front of libmicrohttpd.
 *
 * libmicrohttpd 0.9.75 closes a connection whose first line has no space in it (a bare token,
 * TLS or other binary bytes) without a word, where RFC 9112 section 3 says a server should
 * answer an invalid request-line with 400. So this thread accepts the connections itself,
 * looks at the first line without taking it off the socket (MSG_PEEK), and hands a connection
 * to MHD (MHD_add_connection) as soon as the line is a request line, or its first 8 KiB
 * still could be; otherwise it answers 400 and closes. The same per-client and overall
 * limits MHD applies hold here too, and so does the header deadline, so idle or trickling
 * connections cannot pile up in front of MHD either. */
#include "front_door.h"

#include "clrt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { PEEK_BYTES = 8192, RECHECK_MS = 20 };

typedef struct waiting {
  int fd;
  struct sockaddr_in addr;
  struct timespec opened;
  size_t seen;      /* bytes peeked so far; while no more arrive the fd is not polled (it stays readable) */
  int64_t seen_at_ms;
} waiting;

struct front_door {
  int listen_fd, wake[2];
  struct MHD_Daemon *daemon;
  int max_waiting, max_per_client, header_timeout_s;
  waiting *w;
  int nw;
  pthread_t thread;
  int started;
};

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* tchar of RFC 9110 section 5.6.2: what a method may be made of. */
static int is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c));
}

enum { LINE_BAD = 0, LINE_OK = 1, LINE_MORE = 2 };

/* Whether b[0..n) starts with a request-line, method SP request-target SP HTTP/d.d CRLF (a bare
   LF ends it too, and empty lines before it are skipped, as RFC 9112 section 2.2 allows), or
   could still become one (LINE_MORE). */
int front_door_request_line(const unsigned char *b, size_t n) {
  size_t i = 0;
  while (i < n && (b[i] == '\r' || b[i] == '\n') && i < 8) i++;
  size_t m = i;
  while (i < n && is_tchar(b[i])) i++;
  if (i == n) return LINE_MORE;
  if (i == m || b[i] != ' ') return LINE_BAD;
  size_t t = ++i;
  while (i < n && b[i] > ' ' && b[i] != 0x7f) i++;
  if (i == n) return LINE_MORE;
  if (i == t || b[i] != ' ') return LINE_BAD;
  i++;
  static const char version[] = "HTTP/d.d";
  for (size_t k = 0; k < sizeof version - 1; k++, i++) {
    if (i == n) return LINE_MORE;
    int ok = version[k] == 'd' ? (b[i] >= '0' && b[i] <= '9') : b[i] == (unsigned char)version[k];
    if (!ok) return LINE_BAD;
  }
  if (i < n && b[i] == '\r') i++;
  if (i == n) return LINE_MORE;
  return b[i] == '\n' ? LINE_OK : LINE_BAD;
}

/* A short answer and the end of the connection; the socket is non-blocking, so a client that
   reads nothing loses the answer, never the thread. What the client sent is read first: a
   socket closed with unread bytes resets the connection, and the reset can overtake the
   answer. */
static void refuse(int fd, int status, const char *reason, const char *code, const char *message) {
  char body[256], msg[768], sink[4096];
  for (int k = 0; k < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++) {
  }
  int bl = snprintf(body, sizeof body,
                    "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
                    "\"code\":\"%s\"}}",
                    message, code);
  int ml = snprintf(msg, sizeof msg,
                    "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    "Content-Length: %d\r\n\r\n%s",
                    status, reason, bl, body);
  (void)!send(fd, msg, (size_t)ml, MSG_NOSIGNAL);   /* one segment: a client reading once gets it all */
  shutdown(fd, SHUT_WR);
  close(fd);
}

static void drop(front_door *f, int i) { f->w[i] = f->w[--f->nw]; }

static void hand_over(front_door *f, int i) {
  waiting *w = &f->w[i];
  int fl = fcntl(w->fd, F_GETFL);
  if (fl >= 0) fcntl(w->fd, F_SETFL, fl & ~O_NONBLOCK);
  /* MHD applies its own limits here and closes the socket itself if it refuses it */
  MHD_add_connection(f->daemon, w->fd, (const struct sockaddr *)&w->addr, sizeof w->addr);
  drop(f, i);
}

/* 0 when no connection was waiting to be accepted. */
static int accept_one(front_door *f) {
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  int fd = accept4(f->listen_fd, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return 0;
  int same = 0;
  for (int i = 0; i < f->nw; i++) same += f->w[i].addr.sin_addr.s_addr == a.sin_addr.s_addr;
  if (same >= f->max_per_client) {
    refuse(fd, 503, "Service Unavailable", "too_many_connections", "too many connections from this client");
    return 1;
  }
  if (f->nw >= f->max_waiting) {
    refuse(fd, 503, "Service Unavailable", "server_busy", "too many connections are waiting to send a request");
    return 1;
  }
  waiting *w = &f->w[f->nw++];
  memset(w, 0, sizeof *w);
  w->fd = fd;
  w->addr = a;
  clock_gettime(CLOCK_MONOTONIC, &w->opened);
  return 1;
}

/* What the first bytes of waiting connection i say; 1 when it left the list. */
static int look(front_door *f, int i) {
  waiting *w = &f->w[i];
  unsigned char b[PEEK_BYTES];
  ssize_t n = recv(w->fd, b, sizeof b, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    close(w->fd);   /* gone before it said anything */
    drop(f, i);
    return 1;
  }
  if (n < 0) return 0;
  int verdict = front_door_request_line(b, (size_t)n);
  if (verdict == LINE_OK || (verdict == LINE_MORE && (size_t)n == sizeof b)) {
    hand_over(f, i);   /* a long target: MHD answers its own 414 */
    return 1;
  }
  if (verdict == LINE_BAD) {
    refuse(w->fd, 400, "Bad Request", "bad_request_line",
           "the request's first line is not an HTTP request-line (method SP target SP HTTP/x.y)");
    drop(f, i);
    return 1;
  }
  w->seen = (size_t)n;
  w->seen_at_ms = now_ms();
  return 0;
}

static void *front_door_main(void *arg) {
  front_door *f = arg;
  struct pollfd *p = malloc(sizeof *p * (size_t)(f->max_waiting + 2));
  int *who = malloc(sizeof *who * (size_t)(f->max_waiting + 2));
  if (!p || !who) {
    free(p), free(who);
    return NULL;
  }
  for (;;) {
    int np = 0, partial = 0;
    p[np++] = (struct pollfd){f->wake[0], POLLIN, 0};
    p[np++] = (struct pollfd){f->listen_fd, POLLIN, 0};
    for (int i = 0; i < f->nw; i++) {
      if (f->w[i].seen) {   /* peeked and still readable: looked at again on the timer */
        partial = 1;
        continue;
      }
      who[np] = i;
      p[np++] = (struct pollfd){f->w[i].fd, POLLIN, 0};
    }
    int r = poll(p, (nfds_t)np, partial ? RECHECK_MS : 500);
    if (r < 0 && errno != EINTR) break;
    if (p[0].revents) break;   /* stop */
    /* from the last so that dropping one (moved from the end) leaves the indexes below valid */
    for (int k = np - 1; k >= 2; k--)
      if (p[k].revents) look(f, who[k]);
    int64_t t = now_ms();
    for (int i = f->nw - 1; i >= 0; i--) {
      waiting *w = &f->w[i];
      if (w->seen && t - w->seen_at_ms >= RECHECK_MS && look(f, i)) continue;
      if (t - ((int64_t)w->opened.tv_sec * 1000 + w->opened.tv_nsec / 1000000) >= (int64_t)f->header_timeout_s * 1000) {
        refuse(w->fd, 408, "Request Timeout", "request_timeout", "no request line within the header timeout");
        drop(f, i);
      }
    }
    if (p[1].revents & POLLIN)
      for (int k = 0; k < 16 && accept_one(f); k++) {   /* a burst of new connections, a few at a time */
      }
  }
  free(p);
  free(who);
  return NULL;
}

front_door *front_door_start(const struct sockaddr_in *addr, struct MHD_Daemon *daemon, int max_waiting,
                             int max_per_client, int header_timeout_s, int *port) {
  front_door *f = calloc(1, sizeof *f);
  if (!f) {
    clrt_set_error("serve: out of memory");
    return NULL;
  }
  f->daemon = daemon;
  f->max_waiting = max_waiting;
  f->max_per_client = max_per_client;
  f->header_timeout_s = header_timeout_s;
  f->wake[0] = f->wake[1] = -1;
  f->w = calloc((size_t)max_waiting, sizeof *f->w);
  f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  struct sockaddr_in bound;
  socklen_t bl = sizeof bound;
  if (!f->w || f->listen_fd < 0 || setsockopt(f->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(f->listen_fd, (const struct sockaddr *)addr, sizeof *addr) || listen(f->listen_fd, 512) ||
      getsockname(f->listen_fd, (struct sockaddr *)&bound, &bl) || pipe2(f->wake, O_CLOEXEC)) {
    front_door_stop(f);
    return NULL;
  }
  *port = ntohs(bound.sin_port);
  if (pthread_create(&f->thread, NULL, front_door_main, f)) {
    front_door_stop(f);
    return NULL;
  }
  f->started = 1;
  return f;
}

void front_door_stop(front_door *f) {
  if (!f) return;
  if (f->started) {
    (void)!write(f->wake[1], "x", 1);
    pthread_join(f->thread, NULL);
  }
  for (int i = 0; i < f->nw; i++) close(f->w[i].fd);
  if (f->listen_fd >= 0) close(f->listen_fd);
  if (f->wake[0] >= 0) close(f->wake[0]);
  if (f->wake[1] >= 0) close(f->wake[1]);
  free(f->w);
  free(f);
}
