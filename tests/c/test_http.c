/* test_http.c — the libcurl event loop (runtime/net/http.c) against a one-connection server
   written inline: the test listens on 127.0.0.1, and between polls of the loop accepts the
   connection, reads the request and writes a canned reply, all on one thread. Checks what
   was sent (method, headers, body), what comes back (status, body, headers, Retry-After),
   the body-size limit, cancel, connection errors and bad arguments. */
#include "check.h"
#include "clrt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int listen_fd;
static int port;

static void start_listener(void) {
  listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd, (struct sockaddr *)&a, sizeof a);
  listen(listen_fd, 4);
  socklen_t len = sizeof a;
  getsockname(listen_fd, (struct sockaddr *)&a, &len);
  port = ntohs(a.sin_port);
  fcntl(listen_fd, F_SETFL, O_NONBLOCK);
}

/* Serve one request on a new connection: poll the loop until the client connects, read up to
   the end of the body (Content-Length), reply, close. Returns the request text. */
static char request_seen[8192];
static void serve_one(clrt_http *h, const char *reply, size_t reply_len) {
  int fd = -1;
  for (int i = 0; i < 500 && fd < 0; i++) {
    clrt_http_poll(h, 5);
    fd = accept(listen_fd, NULL, NULL);
  }
  if (fd < 0) {
    fprintf(stderr, "no connection\n");
    return;
  }
  size_t got = 0;
  request_seen[0] = 0;
  for (int i = 0; i < 2000; i++) {
    clrt_http_poll(h, 0);
    ssize_t n = recv(fd, request_seen + got, sizeof request_seen - 1 - got, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      request_seen[got] = 0;
    } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      break;
    }
    char *end = strstr(request_seen, "\r\n\r\n");
    char *cl = strstr(request_seen, "Content-Length: ");
    if (end && (!cl || got >= (size_t)(end + 4 - request_seen) + (size_t)atoi(cl + 16))) break;
    usleep(1000);
  }
  if (write(fd, reply, reply_len) < 0) perror("write");
  close(fd);
}

static int wait_result(clrt_http *h, clrt_http_result *r) {
  for (int i = 0; i < 400; i++) {
    if (clrt_http_poll(h, 10) < 0) return 0;
    if (clrt_http_next(h, r)) return 1;
  }
  return 0;
}

static void test_round_trip(void) {
  clrt_http *h = clrt_http_new(0);
  CHECK(h != NULL);
  const char *body = "{\"q\": 1}";
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", port);
  int64_t id = clrt_http_submit(h, "POST", url, "X-Test: yes\r\nAuthorization: Bearer k", body, strlen(body), 5, NULL);
  CHECK(id > 0);
  CHECK(clrt_http_in_flight(h) == 1);
  const char reply[] = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                       "retry-after: 7\r\nContent-Length: 11\r\nConnection: close\r\n\r\n{\"e\": \"rl\"}";
  serve_one(h, reply, sizeof reply - 1);
  CHECK(strncmp(request_seen, "POST /v1/chat/completions HTTP/1.1\r\n", 36) == 0);
  CHECK(strstr(request_seen, "\r\nX-Test: yes\r\n") != NULL);
  CHECK(strstr(request_seen, "\r\nAuthorization: Bearer k\r\n") != NULL);
  CHECK(strstr(request_seen, "Expect:") == NULL);
  CHECK(strstr(request_seen, "\r\n\r\n{\"q\": 1}") != NULL);
  clrt_http_result r;
  CHECK(wait_result(h, &r));
  CHECK(r.id == id);
  CHECK(r.status == 429);
  CHECK(r.error_code == 0);
  CHECK(r.error[0] == 0);
  CHECK_NEAR(r.retry_after, 7, 0);
  CHECK(r.body_len == 11 && strcmp(r.body, "{\"e\": \"rl\"}") == 0);
  CHECK(strstr(r.headers, "Content-Type: application/json") != NULL);
  CHECK(r.elapsed > 0 && r.elapsed < 5);
  CHECK(clrt_http_in_flight(h) == 0);
  CHECK(clrt_http_next(h, &r) == 0);

  /* Retry-After as an HTTP date in the past means "now"; a GET has no body. */
  id = clrt_http_submit(h, "GET", url, NULL, NULL, 0, 5, NULL);
  const char reply2[] = "HTTP/1.1 503 Busy\r\nRetry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n"
                        "Content-Length: 0\r\nConnection: close\r\n\r\n";
  serve_one(h, reply2, sizeof reply2 - 1);
  CHECK(strncmp(request_seen, "GET /v1/chat/completions HTTP/1.1\r\n", 35) == 0);
  CHECK(wait_result(h, &r));
  CHECK(r.status == 503 && r.body_len == 0);
  CHECK_NEAR(r.retry_after, 0, 0);

  /* No Retry-After: -1. A body over the limit fails the transfer with a clear message. */
  clrt_http_set_max_body(h, 8);
  id = clrt_http_submit(h, "POST", url, NULL, "x", 1, 5, NULL);
  const char reply3[] = "HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\n01234567890123456789";
  serve_one(h, reply3, sizeof reply3 - 1);
  CHECK(wait_result(h, &r));
  CHECK(r.error_code != 0);
  CHECK(strstr(r.error, "response body larger than 8 bytes") != NULL);
  CHECK_NEAR(r.retry_after, -1, 0);

  /* A truncated reply is an error, not a short body. */
  clrt_http_set_max_body(h, 1 << 20);
  id = clrt_http_submit(h, "POST", url, NULL, "x", 1, 5, NULL);
  const char reply4[] = "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"partial\":";
  serve_one(h, reply4, sizeof reply4 - 1);
  CHECK(wait_result(h, &r));
  CHECK(r.error_code != 0 && r.status == 200);
  CHECK(strstr(r.error, "remaining") != NULL);
  clrt_http_free(h);
}

static void test_timeout_and_cancel(void) {
  clrt_http *h = clrt_http_new(4);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
  /* The listener accepts nothing here, so the request can only time out. */
  int64_t id = clrt_http_submit(h, "POST", url, NULL, "x", 1, 0.2, NULL);
  clrt_http_result r;
  CHECK(wait_result(h, &r));
  CHECK(r.id == id && r.timed_out == 1 && r.status == 0);
  CHECK(strstr(r.error, "timed out after") != NULL);
  int fd;
  while ((fd = accept(listen_fd, NULL, NULL)) >= 0) close(fd);   /* drop the backlog */

  int64_t a = clrt_http_submit(h, "POST", url, NULL, "x", 1, 5, NULL);
  int64_t b = clrt_http_submit(h, "POST", url, NULL, "y", 1, 0.3, NULL);
  CHECK(clrt_http_in_flight(h) == 2);
  CHECK(clrt_http_cancel(h, a) == 0);
  CHECK(clrt_http_in_flight(h) == 1);
  CHECK(clrt_http_cancel(h, a) == -1);
  CHECK_ERROR("no pending request with id");
  CHECK(wait_result(h, &r));
  CHECK(r.id == b);   /* the cancelled one never reports */
  CHECK(clrt_http_poll(h, 20) == 0 && clrt_http_next(h, &r) == 0);
  while ((fd = accept(listen_fd, NULL, NULL)) >= 0) close(fd);
  clrt_http_free(h);
}

static void test_errors(void) {
  clrt_http *h = clrt_http_new(0);
  clrt_http_result r;
  /* Nothing listens on port 1: connection refused arrives as a result, not a crash. */
  int64_t id = clrt_http_submit(h, "POST", "http://127.0.0.1:1/x", NULL, "{}", 2, 5, NULL);
  CHECK(id > 0);
  CHECK(wait_result(h, &r));
  CHECK(r.status == 0 && r.error_code != 0 && r.error[0] != 0);
  CHECK(clrt_http_submit(h, "POST", "file:///etc/passwd", NULL, NULL, 0, 5, NULL) == -1);
  CHECK_ERROR("only http:// and https:// URLs");
  CHECK(clrt_http_submit(h, "POST", "http://127.0.0.1:1/", NULL, NULL, 0, 0, NULL) == -1);
  CHECK_ERROR("timeout must be positive");
  CHECK(clrt_http_submit(h, NULL, "http://127.0.0.1:1/", NULL, NULL, 0, 1, NULL) == -1);
  CHECK_ERROR("needs a loop, a method and a URL");
  CHECK(clrt_http_poll(NULL, 0) == -1);
  /* Freeing a loop with requests in flight releases them. */
  clrt_http_submit(h, "POST", "http://127.0.0.1:1/x", NULL, "{}", 2, 5, NULL);
  clrt_http_free(h);
  /* poll with nothing in flight sleeps about timeout_ms */
  h = clrt_http_new(0);
  double t0 = clrt_http_now();
  CHECK(clrt_http_poll(h, 30) == 0);
  CHECK(clrt_http_now() - t0 >= 0.02);
  clrt_http_free(h);
}

int main(void) {
  start_listener();
  test_round_trip();
  test_timeout_and_cancel();
  test_errors();
  close(listen_fd);
  return check_summary();
}
