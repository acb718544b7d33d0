/* front_door.h — the listening socket of `clrt serve`: connections reach libmicrohttpd only
   once their first line is an HTTP request-line (front_door.c says why). */
#ifndef CLRT_FRONT_DOOR_H
#define CLRT_FRONT_DOOR_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <stddef.h>

typedef struct front_door front_door;

/* Listens on addr (port 0: any free one, written to *port) and hands connections to daemon,
   which must have been started with MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC. At most
   max_waiting connections wait for their first line, max_per_client of them from one address
   (503 beyond either); one that sends no request-line within header_timeout_s gets 408. NULL
   with the error set when the address cannot be bound. */
front_door *front_door_start(const struct sockaddr_in *addr, struct MHD_Daemon *daemon, int max_waiting,
                             int max_per_client, int header_timeout_s, int *port);
/* Stops accepting and closes the connections still waiting; MHD's own are the daemon's. */
void front_door_stop(front_door *f);

/* 1 when b[0..n) begins with a request-line (RFC 9112 section 3), 2 while it still could,
   0 when it cannot (exposed for the tests). */
int front_door_request_line(const unsigned char *b, size_t n);

#endif
