#!/usr/bin/env python3
"""A stand-in for `tessera serve` to develop and test the web page against, with the standard
library only: serves src/serve/page/index.html at /, /health, /v1/models, a fake streaming
/v1/chat/completions and a /metrics with the contract's names. Loopback only.
    page_mock.py [--port N] [--api-key KEY] [--page PATH]
The answer names how many messages the request carried (so a test can see the conversation is
sent whole) and echoes the last one; a last message containing "STREAMERROR" gets an error event
after three tokens, one containing "ERROR" otherwise is answered 400."""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = os.path.join(HERE, "..", "..", "src", "serve", "page", "index.html")
MODEL = "mock-model"
KV_TOTAL = 1024


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {"prompt": 0, "gen": 0, "hit": 0, "query": 0, "bytes": 0}
        self.running = 0
        self.requests = {}  # (endpoint, status) -> count
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def count(self, endpoint, status):
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def metrics(self):
        with self.lock:
            c, run = dict(self.c), self.running
            used = min(KV_TOTAL, run * 37)
            lines = ["# TYPE tessera_requests_total counter"]
            for (ep, st), n in sorted(self.requests.items()):
                lines.append(f'tessera_requests_total{{endpoint="{ep}",status="{st}"}} {n}')
            for name, kind, v in [
                    ("tessera_prompt_tokens_total", "counter", c["prompt"]),
                    ("tessera_generation_tokens_total", "counter", c["gen"]),
                    ("tessera_prefix_cache_hit_tokens_total", "counter", c["hit"]),
                    ("tessera_prefix_cache_query_tokens_total", "counter", c["query"]),
                    ("tessera_preemptions_total", "counter", 0),
                    ("tessera_memory_read_bytes_total", "counter", c["bytes"]),
                    ("tessera_memory_bandwidth_bytes_per_second", "gauge", 20e9),
                    ("tessera_requests_running", "gauge", run),
                    ("tessera_requests_waiting", "gauge", 0),
                    ("tessera_kv_blocks_used", "gauge", used),
                    ("tessera_kv_blocks_free", "gauge", KV_TOTAL - used),
                    ("vllm:num_requests_running", "gauge", run),
                    ("vllm:kv_cache_usage_perc", "gauge", used / KV_TOTAL)]:
                lines += [f"# HELP {name} mock", f"# TYPE {name} {kind}", f"{name} {v}"]
            name = "tessera_time_to_first_token_seconds"
            lines += [f"# TYPE {name} histogram",
                      f'{name}_bucket{{le="+Inf"}} {self.ttft_count}',
                      f"{name}_sum {self.ttft_sum}", f"{name}_count {self.ttft_count}"]
        return "\n".join(lines) + "\n"


STATE = State()
ARGS = None


def error_body(status, message, type_="invalid_request_error", code=None):
    return status, {"error": {"message": message, "type": type_, "param": None, "code": code}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def send_body(self, status, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        STATE.count(self.path, status)

    def authorized(self):
        if not ARGS.api_key or self.headers.get("Authorization") == "Bearer " + ARGS.api_key:
            return True
        self.send_body(*error_body(401, "invalid or missing API key", "authentication_error",
                                   "invalid_api_key"))
        return False

    def do_GET(self):
        if self.path == "/":
            with open(ARGS.page, "rb") as f:
                self.send_body(200, f.read(), "text/html; charset=utf-8")
        elif self.path == "/health":
            self.send_body(200, {"status": "ok"})
        elif self.path == "/metrics":
            self.send_body(200, STATE.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            if self.authorized():
                self.send_body(200, {"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "tessera"}]})
        else:
            self.send_body(*error_body(404, f"no such endpoint: GET {self.path}"))

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            return self.send_body(*error_body(404, f"no such endpoint: POST {self.path}"))
        if not self.authorized():
            return
        try:
            req = json.loads(raw)
            messages = req["messages"]
            last = str(messages[-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return self.send_body(*error_body(400, "messages: expected a non-empty list"))
        if "ERROR" in last and "STREAMERROR" not in last:
            return self.send_body(*error_body(400, "mock error: the message asked for one"))
        max_tokens = int(req.get("max_tokens") or 64)
        words = (f'Mock answer to "{last[:60]}" ({len(messages)} message{"s" if len(messages) != 1 else ""} in the conversation). '
                 + " ".join(f"word{i}" for i in range(1, 400))).split(" ")
        pieces = [w + " " for w in words[:max_tokens]]
        prompt_tokens = sum(len(str(m.get("content", "")).split()) + 4 for m in messages)
        with STATE.lock:
            STATE.c["prompt"] += prompt_tokens
            STATE.c["query"] += prompt_tokens
            STATE.c["hit"] += prompt_tokens // 2
            STATE.running += 1
        try:
            if req.get("stream"):
                self.stream(pieces, prompt_tokens, req, "STREAMERROR" in last)
            else:
                with STATE.lock:
                    STATE.c["gen"] += len(pieces)
                self.send_body(200, {
                    "id": "chatcmpl-mock", "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": "".join(pieces)}}],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
                              "total_tokens": prompt_tokens + len(pieces)}})
        finally:
            with STATE.lock:
                STATE.running -= 1

    def stream(self, pieces, prompt_tokens, req, fail):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        status = 200

        def event(obj):
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def chunk(delta, finish=None):
            return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": MODEL,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        start = time.time()
        try:
            event(chunk({"role": "assistant", "content": ""}))
            for i, p in enumerate(pieces):
                if fail and i == 3:
                    event({"error": {"message": "mock stream error", "type": "server_error",
                                     "param": None, "code": None}})
                    break
                time.sleep(ARGS.token_delay)
                event(chunk({"content": p}))
                with STATE.lock:
                    STATE.c["gen"] += 1
                    STATE.c["bytes"] += 90_000_000
                    if i == 0:
                        STATE.ttft_sum += time.time() - start
                        STATE.ttft_count += 1
            if not fail:
                event(chunk({}, "length"))
            if not fail and (req.get("stream_options") or {}).get("include_usage"):
                event({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "model": MODEL,
                       "choices": [], "usage": {
                           "prompt_tokens": prompt_tokens, "completion_tokens": len(pieces),
                           "total_tokens": prompt_tokens + len(pieces),
                           "prompt_tokens_details": {"cached_tokens": prompt_tokens // 2}}})
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            status = 499  # the client went away (the page's stop button)
        STATE.count(self.path, status)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--api-key", default="")
    ap.add_argument("--page", default=PAGE)
    ap.add_argument("--token-delay", type=float, default=0.04, help="seconds between tokens")
    ARGS = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
