#!/usr/bin/python3
"""A local OpenAI-compatible /v1/chat/completions endpoint that plays the three LLM roles of a
CollabLLM run -- simulated user, judge and extractor -- by the JSON schema each request asks
for, and records every request. For the real-path test, where no API can be reached.

    fake_collab_endpoint.py LOG_FILE [--lifetime S] [--delay-ms MAX] [--fixed-delay-ms MS]

Binds 127.0.0.1 on an ephemeral port, prints "PORT PID" on stdout, appends each request body
(one JSON object a line) to LOG_FILE, and exits after --lifetime seconds. The role is read
from response_format.json_schema.schema.properties (the request's own contract):
  "response"          simulated user: ends the chat, answers "5" (a bare number), or asks more
  "accuracy"          judge: 0 or 1
  "interactivity"     judge: three part scores from {1, 0.7, 0.3, 0} and their mean
  "final_completion"  extractor: for a code task (the prompt names an entry point) a correct or
                      a wrong implementation of task_func; otherwise a short document
  "shard_id"          Lost in Conversation's user (lua/prompts/sharded_user.txt): reveals the
                      first shard of the prompt's not-yet-given list, its text as it is (so a
                      test can see which shard text reached the assistant), or none (-1) on
                      every third request
  "response_type"     the strategy judge: answer_attempt when the reply quoted in the prompt
                      has "ANSWER", else clarification
  model "fake-assistant" (no response_format: the policy of recipes/build_dataset.lua's
                      assistant.base_url): a plain-text reply, a clarifying question or an answer
Choices depend on a hash of the request (its seed included), so replies differ between
conversations and rewards vary, yet a rerun sees the same answers. Any other request without
response_format gets 400: every simulator and judge call in a CollabLLM run is expected to ask
for its schema. --delay-ms holds each reply for
a random time up to MAX ms (an unseeded draw), so replies come back in a different order in
every run while their content stays a function of the request. --fixed-delay-ms holds each
reply exactly MS ms (an API's latency, for bench/rl_step.lua; requests are served in parallel).
"""
import argparse
import hashlib
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Code as an extractor following its prompt returns it: the program alone, no fences (the
# metric runs the whole final_completion, as the references do).
GOOD_CODE = (
    "import numpy as np\n\n"
    "def task_func(values):\n"
    "    arr = np.asarray(values, dtype=float)\n"
    "    return float(arr.mean()), float(arr.std())\n"
)
BAD_CODE = "def task_func(values):\n    return 0, 0\n"
DOCUMENT = ("Dear team, the garden party moves to Saturday at four. Bring a dish to share; "
            "we will set up the tables at three. Thanks, Maria")


def pick(text, n):
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % n


ASSISTANT_REPLIES = [
    "Could you tell me which part matters most to you?",
    "Here is my answer: the result is 7.",
    "Here is a short draft you can edit: plans move to Saturday.",
]


def reply_for(body):
    if body.get("model") == "fake-assistant" and not body.get("response_format"):
        return ASSISTANT_REPLIES[pick(json.dumps(body, sort_keys=True), len(ASSISTANT_REPLIES))]
    rf = body.get("response_format") or {}
    schema = ((rf.get("json_schema") or {}).get("schema") or {})
    props = schema.get("properties") or {}
    prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
    h = pick(prompt, 6)
    if "shard_id" in props:
        hidden = prompt.split("Shards the person has not given yet:\n", 1)[1].split("\n\nRules:", 1)[0]
        shards = json.loads(hidden)
        if not shards or h % 3 == 0:
            return {"thought": "nothing fits", "response": "not sure, does it matter", "shard_id": -1}
        return {"thought": "the first one fits", "response": shards[0]["shard"], "shard_id": shards[0]["shard_id"]}
    if "response_type" in props:
        reply = prompt.split("<reply>", 1)[1].split("</reply>", 1)[0]
        return {"thought": "read the reply", "response_type": "answer_attempt" if "ANSWER" in reply else "clarification"}
    if "response" in props:
        if h < 2:
            said = "Thanks, that is what I needed. [[TERMINATE CHAT]]"
        elif h < 4:
            said = "5"     # a bare number: lenient JSON readers turn it into 5
        else:
            said = "Can you make it a bit shorter and say why?"
        return {"current_answer": "a first draft", "thought": "I will keep it short.", "response": said}
    if "accuracy" in props:
        return {"thought": "Compared the final answer with the reference.", "accuracy": h % 2}
    if "interactivity" in props:
        levels = [1.0, 0.7, 0.3, 0.0]
        u, c, s = levels[h % 4], levels[(h // 2) % 4], levels[(h + 1) % 4]
        return {"thought": "Judged the three parts.", "understanding": u, "clarification": c,
                "suggestions": s, "interactivity": round((u + c + s) / 3, 4)}
    if "final_completion" in props:
        if "task_func" in prompt:
            return {"thought": "The last code block.", "final_completion": GOOD_CODE if h % 2 == 0 else BAD_CODE}
        return {"thought": "The final version.", "final_completion": DOCUMENT}
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send(self, code, obj):
        data = json.dumps(obj).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw)
        except ValueError:
            return self.send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
        with self.server.lock:
            with open(self.server.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(body) + "\n")
        if not self.path.endswith("/chat/completions"):
            return self.send(404, {"error": {"message": "no route " + self.path, "type": "invalid_request_error"}})
        if self.server.delay_ms > 0:
            time.sleep(random.uniform(0, self.server.delay_ms) / 1000)
        if self.server.fixed_delay_ms > 0:
            time.sleep(self.server.fixed_delay_ms / 1000)
        out = reply_for(body)
        if out is None:
            got = json.dumps(body.get("response_format"))[:300]
            return self.send(400, {"error": {"message": "response_format json_schema expected, got " + got,
                                             "type": "invalid_request_error"}})
        content = out if isinstance(out, str) else json.dumps(out)
        self.send(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(json.dumps(body)) // 4, "completion_tokens": len(content) // 4,
                      "total_tokens": (len(json.dumps(body)) + len(content)) // 4},
        })


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--lifetime", type=float, default=600)
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--fixed-delay-ms", type=float, default=0)
    a = ap.parse_args()
    # a listen backlog for a run's 64 concurrent requests (socketserver's default is 5: on a
    # loaded machine connections were refused and the run counted dropped futures)
    ThreadingHTTPServer.request_queue_size = 256
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.lock = threading.Lock()
    srv.log_path = a.log
    srv.delay_ms = a.delay_ms
    srv.fixed_delay_ms = a.fixed_delay_ms
    sys.stdout.write("%d %d\n" % (srv.server_address[1], os.getpid()))
    sys.stdout.flush()
    threading.Timer(a.lifetime, lambda: os._exit(0)).start()
    srv.serve_forever()


if __name__ == "__main__":
    main()
