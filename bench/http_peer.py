#!/usr/bin/python3
"""Peer for bench/http.lua: N chat completions over http.client (keep-alive, one connection
per thread) at a given concurrency, JSON encoded and decoded as clrt.llm does.
Prints "wall_seconds cpu_seconds errors"."""
import http.client
import json
import sys
import threading
import time

host, port, conc, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
errors = [0]


def worker(k, count=n):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    for i in range(k, count, conc):
        content = "bench %d" % i
        body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": content}]})
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = json.loads(r.read())
        if data["choices"][0]["message"]["content"] != "echo:" + content:
            errors[0] += 1
    conn.close()


for k in range(min(conc, 4)):   # warm up: imports, first connections
    worker(k, min(n, 50))
errors[0] = 0
t0, c0 = time.perf_counter(), time.process_time()
threads = [threading.Thread(target=worker, args=(k,)) for k in range(conc)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("%.6f %.6f %d" % (time.perf_counter() - t0, time.process_time() - c0, errors[0]))
