/* http.c — one event loop over libcurl's multi interface.

   Lua submits requests (clrt_http_submit) and collects finished ones (clrt_http_poll +
   clrt_http_next); nothing here blocks except clrt_http_poll, for at most its timeout. Many
   requests are in flight at once on one thread, connections are kept alive and reused by
   the multi handle's connection cache, and easy handles are recycled so a request costs no
   setup beyond its own options. Retries, JSON and concurrency limits live in Lua
   (lua/clrt/llm.lua); this file only moves bytes.

   Secrets: request headers (the Authorization header carries the API key) are handed to
   libcurl and never copied into an error message; errors name the method and the id only,
   and libcurl's own messages (CURLOPT_ERRORBUFFER) describe the connection, not headers. */
#include "clrt.h"

#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

enum { MAX_BODY_DEFAULT = 64 << 20 };

typedef struct xfer {
  CURL *easy;
  int64_t id;
  struct curl_slist *headers;
  char *body;                    /* response body, NUL-terminated */
  size_t body_len, body_cap;
  char *hdrs;                    /* header lines of the final response */
  size_t hdrs_len, hdrs_cap;
  double retry_after;            /* seconds; -1 when the response had no Retry-After */
  double t_start, elapsed;       /* seconds (monotonic clock) */
  int too_big;
  size_t max_body;
  char errbuf[CURL_ERROR_SIZE];
  char error[CURL_ERROR_SIZE + 64];
  int status, code, timed_out;
  struct xfer *next;             /* active, done or free list */
} xfer;

struct clrt_http {
  CURLM *multi;
  int64_t next_id;
  size_t max_body;
  int in_flight;
  xfer *active;                  /* added to the multi handle */
  xfer *done_head, *done_tail;   /* finished, not yet handed out */
  xfer *handed;                  /* handed out by the last clrt_http_next */
  xfer *free;                    /* recycled transfers (their easy handles keep DNS caches) */
  int n_free;
};

double clrt_http_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int global_ready;

clrt_http *clrt_http_new(int max_connections) {
  if (!global_ready) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      clrt_set_error("http: curl_global_init failed");
      return NULL;
    }
    global_ready = 1;
  }
  clrt_http *h = calloc(1, sizeof *h);
  if (!h) {
    clrt_set_error("http: out of memory creating the event loop");
    return NULL;
  }
  h->multi = curl_multi_init();
  if (!h->multi) {
    free(h);
    clrt_set_error("http: curl_multi_init failed");
    return NULL;
  }
  h->next_id = 1;
  h->max_body = MAX_BODY_DEFAULT;
  if (max_connections > 0) curl_multi_setopt(h->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)max_connections);
  /* Keep enough idle connections alive that a burst of requests reuses them. */
  curl_multi_setopt(h->multi, CURLMOPT_MAXCONNECTS, (long)(max_connections > 0 ? max_connections : 256));
  return h;
}

static void xfer_destroy(xfer *x) {
  if (!x) return;
  if (x->easy) curl_easy_cleanup(x->easy);
  curl_slist_free_all(x->headers);
  free(x->body);
  free(x->hdrs);
  free(x);
}

enum { MAX_FREE = 256, MAX_KEPT_BUFFER = 1 << 20 };

/* Keep a finished transfer for the next request, unless enough are kept already; a buffer
   a large reply grew is dropped rather than held for small ones. */
static void recycle(clrt_http *h, xfer *x) {
  curl_slist_free_all(x->headers);
  x->headers = NULL;
  if (h->n_free >= MAX_FREE) {
    xfer_destroy(x);
    return;
  }
  if (x->body_cap > MAX_KEPT_BUFFER) {
    free(x->body);
    x->body = NULL;
    x->body_cap = 0;
  }
  x->next = h->free;
  h->free = x;
  h->n_free++;
}

void clrt_http_free(clrt_http *h) {
  if (!h) return;
  for (xfer *x = h->active, *n; x; x = n) {
    n = x->next;
    curl_multi_remove_handle(h->multi, x->easy);
    xfer_destroy(x);
  }
  xfer *lists[3] = {h->done_head, h->handed, h->free};
  for (int i = 0; i < 3; i++)
    for (xfer *x = lists[i], *n; x; x = n) {
      n = x->next;
      xfer_destroy(x);
    }
  curl_multi_cleanup(h->multi);
  free(h);
}

void clrt_http_set_max_body(clrt_http *h, size_t bytes) {
  if (h && bytes > 0) h->max_body = bytes;
}

static int grow(char **buf, size_t *cap, size_t need) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 4096;
  while (c < need) c *= 2;
  char *p = realloc(*buf, c);
  if (!p) return -1;
  *buf = p;
  *cap = c;
  return 0;
}

/* Appends to the response body; returning less than len makes libcurl fail the transfer,
   which is how an oversized body stops instead of exhausting memory. */
static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  xfer *x = ud;
  size_t len = size * n;
  if (x->body_len + len > x->max_body) {
    x->too_big = 1;
    return 0;
  }
  if (grow(&x->body, &x->body_cap, x->body_len + len + 1)) return 0;
  memcpy(x->body + x->body_len, data, len);
  x->body_len += len;
  x->body[x->body_len] = 0;
  return len;
}

static double parse_retry_after(const char *v) {
  while (*v == ' ' || *v == '\t') v++;
  if (*v >= '0' && *v <= '9') {
    char *end;
    double s = strtod(v, &end);
    return s >= 0 ? s : -1;
  }
  time_t when = curl_getdate(v, NULL);
  if (when < 0) return -1;
  double d = difftime(when, time(NULL));
  return d > 0 ? d : 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  xfer *x = ud;
  size_t len = size * n;
  /* A new status line starts a new response (after 100 Continue or a redirect): keep only
     the final response's headers. */
  if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
    x->hdrs_len = 0;
    x->retry_after = -1;
  }
  if (grow(&x->hdrs, &x->hdrs_cap, x->hdrs_len + len + 1)) return 0;
  memcpy(x->hdrs + x->hdrs_len, data, len);
  x->hdrs_len += len;
  x->hdrs[x->hdrs_len] = 0;
  if (len > 12 && strncasecmp(data, "retry-after:", 12) == 0) {
    char v[128];
    size_t m = len - 12 < sizeof v - 1 ? len - 12 : sizeof v - 1;
    memcpy(v, data + 12, m);
    v[m] = 0;
    for (size_t i = m; i > 0 && (v[i - 1] == '\r' || v[i - 1] == '\n' || v[i - 1] == ' '); i--) v[i - 1] = 0;
    x->retry_after = parse_retry_after(v);
  }
  return len;
}

static xfer *take_xfer(clrt_http *h) {
  xfer *x = h->free;
  if (x) {
    h->free = x->next;
    h->n_free--;
    curl_easy_reset(x->easy);
  } else {
    x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->easy = curl_easy_init();
    if (!x->easy) {
      free(x);
      return NULL;
    }
  }
  x->next = NULL;
  x->body_len = x->hdrs_len = 0;
  if (x->body) x->body[0] = 0;
  if (x->hdrs) x->hdrs[0] = 0;
  x->retry_after = -1;
  x->too_big = 0;
  x->max_body = h->max_body;
  x->errbuf[0] = x->error[0] = 0;
  x->status = x->code = x->timed_out = 0;
  return x;
}

/* headers: "Name: value" lines separated by '\n' (NULL for none). */
static int set_headers(xfer *x, const char *headers) {
  struct curl_slist *l = NULL, *t;
  /* Without this libcurl waits up to a second for "100 Continue" before sending bodies
     over 1 KiB, and many servers never send it. */
  if (!(t = curl_slist_append(l, "Expect:"))) return -1;
  l = t;
  for (const char *p = headers; p && *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n > 0 && p[n - 1] == '\r') n--;
    if (n > 0) {
      char *line = malloc(n + 1);
      if (!line) goto fail;
      memcpy(line, p, n);
      line[n] = 0;
      t = curl_slist_append(l, line);
      /* The line may hold a secret: wipe our copy before freeing it. */
      memset(line, 0, n);
      free(line);
      if (!t) goto fail;
      l = t;
    }
    p = e ? e + 1 : p + n;
  }
  x->headers = l;
  return 0;
fail:
  curl_slist_free_all(l);
  return -1;
}

int64_t clrt_http_submit(clrt_http *h, const char *method, const char *url, const char *headers,
                         const char *body, size_t body_len, double timeout_s, const char *ca_file) {
  if (!h || !method || !url) {
    clrt_set_error("http: submit needs a loop, a method and a URL");
    return -1;
  }
  if (!(timeout_s > 0)) {
    clrt_set_error("http: %s %s: timeout must be positive, got %g s", method, url, timeout_s);
    return -1;
  }
  if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
    clrt_set_error("http: %s '%s': only http:// and https:// URLs are supported", method, url);
    return -1;
  }
  xfer *x = take_xfer(h);
  if (!x || set_headers(x, headers)) {
    if (x) recycle(h, x);
    clrt_set_error("http: out of memory submitting %s %s", method, url);
    return -1;
  }
  CURL *e = x->easy;
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  if (ca_file && *ca_file) curl_easy_setopt(e, CURLOPT_CAINFO, ca_file);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000.0 + 0.5));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->errbuf);
  curl_easy_setopt(e, CURLOPT_PRIVATE, x);
  if (strcmp(method, "GET") == 0) {
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else {
    if (strcmp(method, "POST") != 0) curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (body || strcmp(method, "POST") == 0) {
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? body_len : 0));
      curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, body ? body : "");
    }
  }
  CURLMcode mc = curl_multi_add_handle(h->multi, e);
  if (mc != CURLM_OK) {
    recycle(h, x);
    clrt_set_error("http: %s %s: cannot start the request: %s", method, url, curl_multi_strerror(mc));
    return -1;
  }
  x->id = h->next_id++;
  x->t_start = clrt_http_now();
  x->next = h->active;
  h->active = x;
  h->in_flight++;
  return x->id;
}

static void unlink_active(clrt_http *h, xfer *x) {
  for (xfer **p = &h->active; *p; p = &(*p)->next)
    if (*p == x) {
      *p = x->next;
      x->next = NULL;
      h->in_flight--;
      return;
    }
}

static void collect(clrt_http *h) {
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(h->multi, &left))) {
    if (m->msg != CURLMSG_DONE) continue;
    xfer *x = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    CURLcode rc = m->data.result;
    curl_multi_remove_handle(h->multi, m->easy_handle);
    if (!x) continue;
    unlink_active(h, x);
    long status = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &status);
    x->status = (int)status;
    x->code = (int)rc;
    x->timed_out = rc == CURLE_OPERATION_TIMEDOUT;
    double elapsed = x->elapsed = clrt_http_now() - x->t_start;
    if (rc == CURLE_OK)
      x->error[0] = 0;
    else if (x->too_big)
      snprintf(x->error, sizeof x->error, "response body larger than %zu bytes", x->max_body);
    else if (x->timed_out)
      snprintf(x->error, sizeof x->error, "timed out after %.2f s (%s)", elapsed,
               x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    else
      snprintf(x->error, sizeof x->error, "%s", x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    if (h->done_tail)
      h->done_tail->next = x;
    else
      h->done_head = x;
    h->done_tail = x;
  }
}

int clrt_http_poll(clrt_http *h, int timeout_ms) { return clrt_http_poll_fds(h, timeout_ms, NULL, 0); }

int clrt_http_poll_fds(clrt_http *h, int timeout_ms, const int *fds, int nfds) {
  enum { MAX_EXTRA = 1024 };
  struct curl_waitfd extra[MAX_EXTRA];
  if (nfds < 0 || nfds > MAX_EXTRA || (nfds > 0 && !fds)) {
    clrt_set_error("http: poll can watch 0..%d extra descriptors, got %d", MAX_EXTRA, nfds);
    return -1;
  }
  for (int i = 0; i < nfds; i++) {
    extra[i].fd = fds[i];
    extra[i].events = CURL_WAIT_POLLIN;
    extra[i].revents = 0;
  }
  if (!h) {
    clrt_set_error("http: poll needs a loop");
    return -1;
  }
  /* Ctrl-C: the REPL's hook may never fire while JIT-compiled code loops around poll. */
  if (clrt_interrupted()) {
    clrt_set_error("interrupted");
    return -1;
  }
  int running = 0, n = 0;
  CURLMcode mc = curl_multi_perform(h->multi, &running);
  collect(h);
  if (!h->done_head && timeout_ms > 0) {
    /* With no transfers curl_multi_poll simply sleeps, so this doubles as the back-off
       sleep of a caller that has nothing in flight. */
    if (mc == CURLM_OK) mc = curl_multi_poll(h->multi, nfds > 0 ? extra : NULL, (unsigned)nfds, timeout_ms, NULL);
    if (mc == CURLM_OK) mc = curl_multi_perform(h->multi, &running);
    collect(h);
  }
  if (mc != CURLM_OK) {
    clrt_set_error("http: event loop failed: %s", curl_multi_strerror(mc));
    return -1;
  }
  for (xfer *x = h->done_head; x; x = x->next) n++;
  return n;
}

int clrt_http_next(clrt_http *h, clrt_http_result *out) {
  if (!h || !out) return 0;
  if (h->handed) {
    recycle(h, h->handed);
    h->handed = NULL;
  }
  xfer *x = h->done_head;
  if (!x) return 0;
  h->done_head = x->next;
  if (!h->done_head) h->done_tail = NULL;
  x->next = NULL;
  h->handed = x;
  out->id = x->id;
  out->status = x->status;
  out->error_code = x->code;
  out->timed_out = x->timed_out;
  out->retry_after = x->retry_after;
  out->elapsed = x->elapsed;
  out->error = x->error;
  out->body = x->body ? x->body : "";
  out->body_len = x->body_len;
  out->headers = x->hdrs ? x->hdrs : "";
  out->headers_len = x->hdrs_len;
  return 1;
}

int clrt_http_cancel(clrt_http *h, int64_t id) {
  if (!h) return -1;
  for (xfer *x = h->active; x; x = x->next)
    if (x->id == id) {
      curl_multi_remove_handle(h->multi, x->easy);
      unlink_active(h, x);
      recycle(h, x);
      return 0;
    }
  for (xfer **p = &h->done_head, *prev = NULL; *p; prev = *p, p = &(*p)->next)
    if ((*p)->id == id) {
      xfer *x = *p;
      *p = x->next;
      if (h->done_tail == x) h->done_tail = prev;
      recycle(h, x);
      return 0;
    }
  clrt_set_error("http: cancel: no pending request with id %lld", (long long)id);
  return -1;
}

int clrt_http_in_flight(const clrt_http *h) { return h ? h->in_flight : 0; }
