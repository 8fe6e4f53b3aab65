"""A stand-in for `tessera serve`, used by router_test.py --mock and to find out what a router asks
of its workers: an OpenAI-compatible worker on 127.0.0.1 (standard library only) that implements
the endpoints of the serve contract (GET /health, /metrics, /v1/models; POST /v1/chat/completions
and /v1/completions, streamed or not), names itself in the X-Tessera-Replica header, keeps a
whitespace-token "prefix cache" so that /metrics counts tessera_prefix_cache_hit_tokens_total, and
logs every request it gets (method, path, headers, body) as JSON lines to --log.

  python3 router_mock.py --port PORT [--log FILE] [--extra] [--delay-ms N] [--token-ms N]

--delay-ms: wait before answering (a prefill's time); --token-ms: wait between streamed tokens.

--extra also answers the SGLang-native worker endpoints (/get_server_info, /get_model_info,
/server_info, /model_info, /get_load, /flush_cache, /health_generate), so that an experiment can
tell which of them a router needs; without it those answer 404 like the real server would.
--fail-count N makes the first N completion requests answer --fail-status (default 503)."""
import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "tessera-mock"


class State:
    def __init__(self, port, log_path, extra, delay_ms, token_ms=0, fail_status=0, fail_count=0):
        self.port = port
        self.token_delay = token_ms / 1000.0
        self.fail_status = fail_status
        self.fail_left = fail_count
        self.log_path = log_path
        self.extra = extra
        self.delay = delay_ms / 1000.0
        self.lock = threading.Lock()
        self.prompts = []  # token lists seen, for the mock prefix cache
        self.hit_tokens = 0
        self.query_tokens = 0
        self.requests = {}  # (path, status) -> count
        self.running = 0

    def log(self, entry):
        if not self.log_path:
            return
        with self.lock, open(self.log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def cache(self, text):
        """Counts the longest prefix (in whitespace tokens) shared with an earlier prompt."""
        toks = text.split()
        with self.lock:
            best = 0
            for p in self.prompts:
                n = 0
                for a, b in zip(p, toks):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
            self.prompts.append(toks)
            del self.prompts[:-64]
            self.hit_tokens += best
            self.query_tokens += len(toks)
        return len(toks), best


def prompt_text(path, body):
    if path == "/v1/chat/completions":
        parts = []
        for m in body.get("messages") or []:
            c = m.get("content")
            if isinstance(c, list):
                c = " ".join(x.get("text", "") for x in c if isinstance(x, dict))
            parts.append(f"{m.get('role', '')}: {c or ''}")
        return "\n".join(parts)
    p = body.get("prompt", "")
    return p if isinstance(p, str) else json.dumps(p)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tessera-mock"

    def log_message(self, *args):
        pass

    @property
    def st(self):
        return self.server.state

    def send(self, status, obj, ctype="application/json", path=None):
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Tessera-Replica", f"127.0.0.1:{self.st.port}")
        self.end_headers()
        self.wfile.write(data)
        with self.st.lock:
            k = (path or self.path.split("?")[0], status)
            self.st.requests[k] = self.st.requests.get(k, 0) + 1

    def error(self, status, message, typ="invalid_request_error"):
        self.send(status, {"error": {"message": message, "type": typ, "param": None,
                                     "code": None}})

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def record(self, raw):
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.st.log({"t": time.time(), "method": self.command, "path": self.path,
                     "headers": dict(self.headers.items()), "body": body})
        return body

    def do_GET(self):
        self.record(self.read_body())
        path = self.path.split("?")[0]
        if path == "/health":
            return self.send(200, {"status": "ok"})
        if path == "/v1/models":
            return self.send(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "tessera"}]})
        if path == "/metrics":
            st = self.st
            with st.lock:
                lines = ["# TYPE tessera_requests_total counter"]
                for (p, s), n in sorted(st.requests.items()):
                    lines.append(f'tessera_requests_total{{endpoint="{p}",status="{s}"}} {n}')
                lines += [
                    "# TYPE tessera_prefix_cache_hit_tokens_total counter",
                    f"tessera_prefix_cache_hit_tokens_total {st.hit_tokens}",
                    "# TYPE tessera_prefix_cache_query_tokens_total counter",
                    f"tessera_prefix_cache_query_tokens_total {st.query_tokens}",
                    "# TYPE tessera_requests_running gauge",
                    f"tessera_requests_running {st.running}",
                    "# TYPE tessera_requests_waiting gauge",
                    "tessera_requests_waiting 0",
                ]
            return self.send(200, ("\n".join(lines) + "\n").encode(),
                             "text/plain; version=0.0.4")
        if self.st.extra:
            if path in ("/get_server_info", "/server_info"):
                return self.send(200, {"model_path": MODEL, "tokenizer_path": MODEL,
                                       "dp_size": 1, "version": "0.0.0"})
            if path in ("/get_model_info", "/model_info"):
                return self.send(200, {"model_path": MODEL, "tokenizer_path": MODEL,
                                       "is_generation": True})
            if path == "/get_load":
                return self.send(200, [{"dp_rank": 0, "num_reqs": self.st.running,
                                        "num_waiting_reqs": 0, "num_tokens": 100 + self.st.port % 10}])
            if path == "/health_generate":
                return self.send(200, {"status": "ok"})
        self.error(404, f"no route for GET {path}")

    def do_POST(self):
        raw = self.read_body()
        body = self.record(raw)
        path = self.path.split("?")[0]
        if self.st.extra and path == "/flush_cache":
            return self.send(200, {"status": "ok"})
        if path not in ("/v1/chat/completions", "/v1/completions"):
            return self.error(404, f"no route for POST {path}")
        if not isinstance(body, dict):
            return self.error(400, "body is not a JSON object")
        with self.st.lock:
            fail = self.st.fail_left > 0
            self.st.fail_left -= fail
        if fail:
            return self.error(self.st.fail_status, "injected failure", "server_error")
        with self.st.lock:
            self.st.running += 1
        try:
            self.complete(path, body)
        finally:
            with self.st.lock:
                self.st.running -= 1

    def complete(self, path, body):
        n_prompt, cached = self.st.cache(prompt_text(path, body))
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 8)
        n = max(1, min(n, 64))
        words = [f"w{i}" for i in range(n)]
        chat = path == "/v1/chat/completions"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.st.port}-{time.monotonic_ns()}"
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n,
                 "total_tokens": n_prompt + n,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        if self.st.delay:
            time.sleep(self.st.delay)
        if not body.get("stream"):
            text = " ".join(words)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length", "logprobs": None})
            return self.send(200, {"id": rid, "object": obj, "created": int(time.time()),
                                   "model": body.get("model") or MODEL, "choices": [choice],
                                   "usage": usage}, path=path)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Tessera-Replica", f"127.0.0.1:{self.st.port}")
        self.end_headers()
        obj += ".chunk" if chat else ""

        def event(payload):
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        for i, w in enumerate(words):
            delta = (w if i == 0 else " " + w)
            fin = "length" if i == n - 1 else None
            choice = ({"index": 0, "delta": ({"role": "assistant", "content": delta} if i == 0
                                             else {"content": delta}), "finish_reason": fin}
                      if chat else {"index": 0, "text": delta, "finish_reason": fin})
            event(json.dumps({"id": rid, "object": obj, "created": int(time.time()),
                              "model": body.get("model") or MODEL, "choices": [choice]}))
            if self.st.token_delay:
                time.sleep(self.st.token_delay)
        if (body.get("stream_options") or {}).get("include_usage"):
            event(json.dumps({"id": rid, "object": obj, "created": int(time.time()),
                              "model": body.get("model") or MODEL, "choices": [],
                              "usage": usage}))
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        with self.st.lock:
            k = (path, 200)
            self.st.requests[k] = self.st.requests.get(k, 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", default="")
    ap.add_argument("--extra", action="store_true")
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--token-ms", type=int, default=0)
    ap.add_argument("--fail-status", type=int, default=503)
    ap.add_argument("--fail-count", type=int, default=0)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    srv.daemon_threads = True
    srv.state = State(a.port, a.log, a.extra, a.delay_ms, a.token_ms, a.fail_status,
                     a.fail_count)
    print(f"listening on http://127.0.0.1:{a.port}", file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
