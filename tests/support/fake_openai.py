#!/usr/bin/python3
"""A local OpenAI-compatible /v1/chat/completions server with injectable faults, for tests
and benchmarks. Standard library only. Binds 127.0.0.1 on an ephemeral port, prints "PORT PID"
on the first line of stdout, and exits by itself after --lifetime seconds or --max-requests
requests, whichever comes first.

The last message's content chooses what happens to a request:
  [fault:KIND]    the first time this exact content arrives, answer with fault KIND
  [fault:KINDxN]  the first N times (later attempts succeed)
  [latency:MS]    wait MS milliseconds before answering (adds to --latency-ms)
  [echo_body]     reply with the request body's fields (sorted JSON) as the content
Otherwise the reply's content is "echo:" + that content, so a client can check that every
result belongs to its own request. Fault kinds:
  500, 503, 504   JSON error body          502      HTML error page
  429             Retry-After: --retry-after seconds
  400             JSON error body naming the request ("bad request for <content>")
  401echo         401 whose message repeats the Authorization header (a careless server)
  slow            answer after --slow-s seconds (longer than the client's timeout)
  trunc           200 whose body stops halfway through its Content-Length, then closes
  notjson         200 with a body that is not JSON     badshape  200 JSON without choices
  close           close the connection without answering
With --fault KIND every request gets that fault (e.g. --fault 500: a server that is down).
With --tls CERT KEY it serves https. With --key K every request must carry "Authorization: Bearer K" (else 401).
With --models A,B it answers GET /v1/models with those ids (the key checked as above), and
counts the calls (GET /stats: "models_calls"); without, GET /v1/models is a 404, as on a
server that does not implement it.
"""
import argparse
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULT = re.compile(r"\[fault:([a-z0-9]+?)(?:x(\d+))?\]")
LATENCY = re.compile(r"\[latency:(\d+)\]")


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.seen = {}       # content -> times seen
        self.requests = 0
        self.active = 0      # chat requests being handled now
        self.max_active = 0
        self.connections = set()   # client (host, port) pairs: one per TCP connection
        self.models_calls = 0      # GET /v1/models answered


def make_handler(state):
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"   # keep-alive

        def log_message(self, *a):
            pass

        def send(self, code, body, ctype="application/json", extra=()):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models" and args.models:
                with state.lock:
                    state.models_calls += 1
                if args.key and self.headers.get("Authorization", "") != "Bearer " + args.key:
                    self.send(401, json.dumps({"error": {"message": "Incorrect API key provided"}}))
                    return
                self.send(200, json.dumps({"object": "list", "data": [
                    {"id": m, "object": "model", "owned_by": "fake"} for m in args.models.split(",")]}))
            elif self.path == "/stats":
                with state.lock:
                    self.send(200, json.dumps({"requests": state.requests, "max_active": state.max_active,
                                               "connections": len(state.connections),
                                               "models_calls": state.models_calls}))
            else:
                self.send(404, json.dumps({"error": {"message": "no such path " + self.path}}))

        def do_POST(self):
            with state.lock:
                state.connections.add(self.client_address)
                state.active += 1
                state.max_active = max(state.max_active, state.active)
            try:
                self.chat()
            finally:
                with state.lock:
                    state.active -= 1

        def chat(self):
            with state.lock:
                state.requests += 1
                if state.requests >= args.max_requests:
                    threading.Timer(0.5, os._exit, [0]).start()
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n)
            if self.path != "/v1/chat/completions":
                return self.send(404, json.dumps({"error": {"message": "no such path " + self.path}}))
            auth = self.headers.get("Authorization") or ""
            if args.key and auth != "Bearer " + args.key:
                return self.send(401, json.dumps({"error": {"message": "Incorrect API key provided",
                                                            "type": "invalid_request_error"}}))
            try:
                req = json.loads(raw)
                content = req["messages"][-1]["content"]
            except Exception as e:   # noqa: BLE001 - any bad body is the client's fault
                return self.send(400, json.dumps({"error": {"message": "cannot read request: %s" % e}}))
            with state.lock:
                seen = state.seen.get(content, 0)
                state.seen[content] = seen + 1
            delay = args.latency_ms
            m = LATENCY.search(content)
            if m:
                delay += int(m.group(1))
            if delay > 0:
                time.sleep(delay / 1000.0)
            if args.fault:
                return self.fault(args.fault, content, auth)
            m = FAULT.search(content)
            if m and seen < int(m.group(2) or 1):
                return self.fault(m.group(1), content, auth)
            self.reply(req, content)

        def reply(self, req, content):
            if "[echo_body]" in content:
                text = json.dumps({k: v for k, v in req.items() if k != "messages"}, sort_keys=True)
            else:
                text = "echo:" + content
            prompt_tokens = sum(len(str(msg.get("content", "")).split()) for msg in req["messages"])
            completion_tokens = len(text.split())
            body = {
                "id": "chatcmpl-%d" % state.requests, "object": "chat.completion",
                "created": int(time.time()), "model": req.get("model", ""),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens},
            }
            self.send(200, json.dumps(body))

        def fault(self, kind, content, auth):
            err = lambda msg: json.dumps({"error": {"message": msg, "type": "server_error"}})  # noqa: E731
            if kind in ("500", "503", "504"):
                self.send(int(kind), err("the server had an error processing your request (%s)" % kind))
            elif kind == "502":
                self.send(502, "<html><head><title>502 Bad Gateway</title></head><body><center>"
                          "<h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>",
                          ctype="text/html")
            elif kind == "429":
                self.send(429, err("Rate limit reached, please retry"), extra=[("Retry-After", args.retry_after)])
            elif kind == "400":
                self.send(400, err("bad request for " + content))
            elif kind == "401echo":
                self.send(401, err("Incorrect API key provided: " + auth))
            elif kind == "slow":
                time.sleep(args.slow_s)
                try:
                    self.send(200, json.dumps({"choices": [{"message": {"content": "too late"}}]}))
                except OSError:
                    pass
            elif kind == "trunc":
                data = json.dumps({"choices": [{"message": {"content": "x" * 200}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
            elif kind == "notjson":
                self.send(200, "Sorry, I can't answer that right now.", ctype="text/plain")
            elif kind == "badshape":
                self.send(200, json.dumps({"object": "chat.completion", "model": "m"}))
            elif kind == "close":
                self.close_connection = True
            else:
                self.send(400, err("unknown fault " + kind))

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lifetime", type=float, default=120.0)
    p.add_argument("--max-requests", type=int, default=20000)
    p.add_argument("--latency-ms", type=int, default=0)
    p.add_argument("--retry-after", default="1")
    p.add_argument("--slow-s", type=float, default=2.0)
    p.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve https with this certificate")
    p.add_argument("--key", default=os.environ.get("FAKE_OPENAI_KEY", ""))
    p.add_argument("--fault", default="", help="answer every request with this fault kind")
    p.add_argument("--models", default="", help="comma-separated ids GET /v1/models lists")
    args = p.parse_args()
    ThreadingHTTPServer.request_queue_size = 256   # a burst of 64 connects must not hit SYN retries
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(State(args)))
    server.daemon_threads = True
    if args.tls:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls[0], args.tls[1])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Timer(args.lifetime, os._exit, [0]).start()
    sys.stdout.write("%d %d\n" % (server.server_address[1], os.getpid()))
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
