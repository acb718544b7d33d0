/* test_server_request_line.c — the front door's reading of a connection's first bytes
   (runtime/net/front_door.c): a request-line of RFC 9112 section 3 is one, a prefix of one may
   still become one, anything else is refused before libmicrohttpd sees it. */
#include "check.h"
#include "../../runtime/net/front_door.h"

static int verdict(const char *s) { return front_door_request_line((const unsigned char *)s, strlen(s)); }

int main(void) {
  enum { BAD = 0, OK = 1, MORE = 2 };
  static const struct { const char *line; int want; } cases[] = {
      {"GET / HTTP/1.1\r\n", OK},
      {"POST /v1/chat/completions?stream=1 HTTP/1.1\r\nHost: x\r\n", OK},
      {"GET / HTTP/1.0\n", OK},                       /* a bare LF ends a line too */
      {"\r\nGET /health HTTP/1.1\r\n", OK},           /* an empty line first is skipped */
      {"M-SEARCH * HTTP/1.1\r\n", OK},                /* any token is a method */
      {"", MORE},
      {"GE", MORE},
      {"GET /v1/mod", MORE},
      {"GET / HTT", MORE},
      {"GET / HTTP/1.1", MORE},
      {"GET / HTTP/1.1\r", MORE},
      {"GARBAGE\r\n\r\n", BAD},                       /* a bare token: MHD closed without a word */
      {"\x16\x03\x01\x00\xa5\x01", BAD},              /* a TLS ClientHello on the plain port */
      {"\x01\xff\r\n", BAD},                         /* control bytes */
      {"GET /health\r\n", BAD},                        /* HTTP/0.9's form */
      {"GET /health HTTP/1.1 extra\r\n", BAD},
      {"GET  / HTTP/1.1\r\n", BAD},                    /* an empty target */
      {"GET / http/1.1\r\n", BAD},                     /* HTTP-name is case-sensitive */
      {"GET / HTTP/1.x\r\n", BAD},
      {"G(T / HTTP/1.1\r\n", BAD},                     /* '(' is no tchar */
      {"GET /a\x7f HTTP/1.1\r\n", BAD},
      {" GET / HTTP/1.1\r\n", BAD},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got = verdict(cases[i].line);
    if (got != cases[i].want) fprintf(stderr, "case %zu: %d, expected %d\n", i, got, cases[i].want);
    CHECK(got == cases[i].want);
  }
  /* the same bytes with a NUL inside the target: length-counted, not a C string */
  const unsigned char nul[] = {'G', 'E', 'T', ' ', '/', 0, ' ', 'H'};
  CHECK(front_door_request_line(nul, sizeof nul) == BAD);
  return check_summary();
}
