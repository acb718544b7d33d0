"""Loopback clients for test_serve_limits.lua: what a hostile client does to `clrt serve`
beside normal ones, and what each gets back. Prints one JSON object.

  serve_limits_client.py load PORT         the 100,000-message request beside normal requests
  serve_limits_client.py idle PORT N       N idle connections from 127.0.0.2, then normal requests
  serve_limits_client.py busy PORT N       N idle connections from several addresses, then one request
  serve_limits_client.py loris PORT        a header sent a byte every 0.5 s: when the server closes it
  serve_limits_client.py http PORT         malformed requests (RFC 9112) and their status lines
"""
import json
import resource
import socket
import sys
import threading
import time

PORT = int(sys.argv[2])


def request(method, path, body=None, timeout=60, source=None):
    """One HTTP/1.1 request on its own connection: (status, body, seconds)."""
    t0 = time.monotonic()
    s = socket.socket()
    s.settimeout(timeout)
    if source:
        s.bind((source, 0))
    s.connect(("127.0.0.1", PORT))
    data = body.encode() if isinstance(body, str) else (body or b"")
    head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
        method, path, len(data))
    s.sendall(head.encode() + data)
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        out += chunk
    s.close()
    status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/") else 0
    return status, out.split(b"\r\n\r\n", 1)[-1].decode("utf-8", "replace"), time.monotonic() - t0


def chat(content, **kw):
    return json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **kw})


def normal_round(n=10):
    """n chat requests and n /health probes one after another: their statuses and seconds."""
    out = []
    for i in range(n):
        st, _, dt = request("POST", "/v1/chat/completions", chat("hello %d, how are you?" % i))
        sh, _, dh = request("GET", "/health")
        out.append({"chat": st, "chat_s": dt, "health": sh, "health_s": dh})
    return out


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def idle_connections(n, sources):
    socks = []
    refused = 0
    for i in range(n):
        s = socket.socket()
        s.setblocking(True)
        s.settimeout(5)
        try:
            s.bind((sources[i % len(sources)], 0))
            s.connect(("127.0.0.1", PORT))
            s.send(b"POST /v1/chat/completions HTTP/1.1\r\nHo")   # a request head that never ends
            socks.append(s)
        except OSError:
            refused += 1
            s.close()
    return socks, refused


def main():
    mode = sys.argv[1]
    if mode == "load":
        before = normal_round(8)
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word"} for i in range(100000)]
        big_body = json.dumps({"messages": msgs, "max_tokens": 4})
        big = {}

        def send_big():
            big["status"], big["body"], big["seconds"] = request("POST", "/v1/chat/completions", big_body, timeout=120)
        th = threading.Thread(target=send_big)
        th.start()
        time.sleep(0.05)
        during = []
        while th.is_alive() or not during:
            during += normal_round(1)
        th.join()
        print(json.dumps({"bytes": len(big_body), "before": before, "during": during, "big": big}))
    elif mode == "idle":
        n = int(sys.argv[3])
        limit = raise_fd_limit(n + 200)
        if limit < n + 100:
            print(json.dumps({"skip": "ulimit -n is %d, below %d" % (limit, n + 100)}))
            return
        socks, refused = idle_connections(n, ["127.0.0.2"])
        time.sleep(0.5)
        alive = 0
        for s in socks:   # refused ones read as closed or reset
            try:
                s.setblocking(False)
                alive += 1 if s.recv(1) else 0
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        after = normal_round(5)
        for s in socks:
            s.close()
        print(json.dumps({"opened": n, "fd_limit": limit, "connect_failed": refused, "still_open": alive, "after": after}))
    elif mode == "busy":
        n = int(sys.argv[3])
        socks, _ = idle_connections(n, ["127.0.0.%d" % k for k in range(3, 9)])
        time.sleep(0.3)
        st, body, _ = request("GET", "/health")
        for s in socks:
            s.close()
        time.sleep(0.3)
        st2, _, _ = request("GET", "/health")
        print(json.dumps({"status": st, "body": body, "after_close": st2}))
    elif mode == "loris":
        s = socket.create_connection(("127.0.0.1", PORT))
        t0 = time.monotonic()
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        closed_at = None
        for b in head:
            try:
                s.send(bytes([b]))
                s.settimeout(0.5)
                if s.recv(1) == b"":
                    closed_at = time.monotonic() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                closed_at = time.monotonic() - t0
                break
        print(json.dumps({"closed_after": closed_at}))
    elif mode == "http":
        def raw(data, rest=None):
            s = socket.create_connection(("127.0.0.1", PORT))
            s.settimeout(5)
            s.sendall(data)
            if rest is not None:   # the request line in two pieces, the second a moment later
                time.sleep(0.3)
                s.sendall(rest)
            out = b""
            try:   # to the end: the server closes after these answers
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    out += chunk
            except OSError:
                pass
            s.close()
            status = out.split(b"\r\n", 1)[0].decode("latin-1")
            return status + " " + out.split(b"\r\n\r\n", 1)[-1].decode("latin-1") if b"\r\n\r\n" in out else status
        print(json.dumps({
            "two_lengths": raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
            "same_lengths": raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"),
            "garbage_line": raw(b"this is not http at all\r\n\r\n"),
            "extra_token": raw(b"GET /health HTTP/1.1 extra\r\nHost: x\r\n\r\n"),
            "no_version": raw(b"GET /health\r\n\r\n"),
            "bare_token": raw(b"GARBAGE\r\n\r\n"),
            "tls_hello": raw(bytes.fromhex("16030100a5010000a10303") + bytes(range(32))),
            "binary": raw(b"\x00\xff\xfe\x7f\r\n\r\n"),
            "leading_crlf": raw(b"\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "trickled": raw(b"GE", b"T /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        }))


main()
