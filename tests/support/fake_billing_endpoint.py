#!/usr/bin/python3
"""A local OpenAI-compatible endpoint for the spend tests: it answers like
fake_collab_endpoint.py (the user, judge and extractor by the schema each request asks for;
an echo for a request without one), reports `usage` with prompt_tokens_details.cached_tokens,
keeps its own requests-per-window and tokens-per-window limits like a provider (a request over
them gets 429 with Retry-After), sends x-ratelimit-* headers, and records every request.

    fake_billing_endpoint.py LOG_FILE [--rpm N] [--tpm N] [--window S] [--lifetime S]

Prints "PORT PID" on stdout. LOG_FILE gets one JSON object a line per request:
{"t": arrival (monotonic s), "status": code, "model", "temperature", "usage": {...} (200 only),
 "role": "user" / "judge" / "extractor" / "echo", "body": the request}.
Usage: prompt_tokens = bytes of the messages' JSON // 4 + 3, cached_tokens = a third of that
(whole multiples of 8), completion_tokens = bytes of the reply // 4 + 1.
"""
import argparse
import collections
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_collab_endpoint import reply_for  # noqa: E402


def role_of(body):
    props = (((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}).get("properties") or {}
    if "response" in props:
        return "user"
    if "final_completion" in props:
        return "extractor"
    if props:
        return "judge"
    return "echo"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, obj, headers):
        data = json.dumps(obj).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        srv = self.server
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        t = time.monotonic()
        try:
            body = json.loads(raw)
        except ValueError:
            return self.send(400, {"error": {"message": "body is not JSON"}}, {})
        role = role_of(body)
        if role == "echo":
            text = str(body["messages"][-1].get("content", ""))
            content = "echo:" + text
        else:
            out = reply_for(body)
            content = json.dumps(out)
        prompt = len(json.dumps(body["messages"]).encode("utf-8")) // 4 + 3
        completion = len(content.encode("utf-8")) // 4 + 1
        cached = (prompt // 3) // 8 * 8
        # what the limit counts: the prompt plus the reply it may take, like OpenAI's estimate
        limit_tokens = len(raw) // 4 + int(body.get("max_tokens") or 0)
        with srv.lock:
            win = srv.sent
            while win and win[0][0] <= t - srv.window:
                win.popleft()
            used = sum(x[1] for x in win)
            over = (srv.rpm and len(win) + 1 > srv.rpm) or (srv.tpm and used + prompt + completion > srv.tpm)
            rec = {"t": t, "model": body.get("model"), "temperature": body.get("temperature"), "role": role,
                   "limit_tokens": limit_tokens, "body": body}
            headers = {}
            if over:
                rec["status"] = 429
                wait = max(0.01, win[0][0] + srv.window - t) if win else 0.01
                headers["Retry-After"] = "%.3f" % wait
            else:
                win.append((t, prompt + completion))
                rec["status"] = 200
                rec["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                "total_tokens": prompt + completion, "cached_tokens": cached}
            if srv.rpm:
                reset = (win[0][0] + srv.window - t) if win else 0
                headers["x-ratelimit-limit-requests"] = str(srv.rpm)
                headers["x-ratelimit-remaining-requests"] = str(max(0, srv.rpm - len(win)))
                headers["x-ratelimit-reset-requests"] = "%.3fs" % max(0.0, reset)
            with open(srv.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        if over:
            return self.send(429, {"error": {"message": "Rate limit reached (fake)", "type": "requests"}}, headers)
        self.send(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        }, headers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--rpm", type=int, default=0)
    ap.add_argument("--tpm", type=int, default=0)
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--lifetime", type=float, default=600)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.log_path, srv.rpm, srv.tpm, srv.window = a.log, a.rpm, a.tpm, a.window
    srv.sent = collections.deque()
    sys.stdout.write("%d %d\n" % (srv.server_address[1], os.getpid()))
    sys.stdout.flush()
    threading.Timer(a.lifetime, lambda: os._exit(0)).start()
    srv.serve_forever()


if __name__ == "__main__":
    main()
