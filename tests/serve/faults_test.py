#!/usr/bin/env python3
"""Faults the server must survive with the right status or cleanup, serving everyone else after:
API keys, bad JSON and ill-formed UTF-8, wrong types, an oversized body, an over-long prompt, a
full queue (429 with Retry-After), a client that disconnects mid-stream (its KV blocks freed at
once), many long requests exhausting the KV cache (preemption, then all complete with the
tokens each gives alone), KV blocks back to zero when idle, and SIGTERM (running requests finish
within the grace period, new ones get 503, exit 0).
    faults_test.py TESSERA_BIN MODEL.gguf"""
import http.client
import json
import os
import signal
import socket
import tempfile
import threading
import time

from serve_util import Checks, Server, env_tessera_model, generate_alone

tessera, model = env_tessera_model()
check = Checks()
KEY = "sk-test-0123456789"
AUTH = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}


def chat(text, n_tokens, **extra):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": n_tokens,
            "temperature": 0, **extra}


keys = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
keys.write("# one key per line\n\n" + KEY + "\n")
keys.close()

# --- Keys, bodies, limits, queue, disconnect ------------------------------------------------
with Server(tessera, model, "--api-key-file", keys.name, "--max-body", "64KiB", "--ctx", "512",
            "--max-batch", "1", "--max-queue", "1") as s:
    st, hdr, body = s.post("/v1/chat/completions", chat("Hi", 4))
    check(st == 401 and body["error"]["type"] == "authentication_error", f"no key: {st}")
    st, _, _ = s.post("/v1/chat/completions", chat("Hi", 4), {"Authorization": "Bearer sk-wrong"})
    check(st == 401, f"a wrong key: {st}")
    st, _, _ = s.post("/v1/chat/completions", chat("Hi", 4), {"Authorization": "Bearer " + KEY + "x"})
    check(st == 401, f"a key with one more character: {st}")
    st, hdr, body = s.post("/v1/chat/completions", chat("Hi", 4), AUTH)
    check(st == 200 and body["usage"]["completion_tokens"] <= 4, f"the right key: {st}")
    check(hdr.get("X-Tessera-Replica") == f"127.0.0.1:{s.port}", "the replica header")
    check(s.request("GET", "/health")[0] == 200, "/health needs no key")
    check(s.request("GET", "/metrics")[0] == 200, "/metrics needs no key")
    check(s.request("GET", "/v1/models")[0] == 401, "/v1/models needs the key")

    for raw, what in [(b"{", "truncated JSON"), (b'{"messages": "\xff\xfe"}', "ill-formed UTF-8"),
                      (b"[1]", "not an object"), (b"", "an empty body"),
                      (b'{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}',
                       "a string for an integer"),
                      (b'{"messages":[{"role":"user","content":"x"}],"seed":1e400}',
                       "an absurd number")]:
        st, _, body = s.post("/v1/chat/completions", raw, AUTH)
        check(st == 400 and "error" in body, f"{what}: {st} {body}")
    st, _, body = s.post("/v1/chat/completions", b"{" + b" " * 100000 + b"}", AUTH)
    check(st == 413 and "error" in body, f"a 100 kB body: {st} {body}")
    st, _, body = s.post("/v1/chat/completions", chat("word " * 800, 4), AUTH)
    check(st == 400 and body["error"]["param"] == "messages", f"an over-long prompt: {body}")
    st, _, body = s.post("/v1/chat/completions", chat("Hi", 600), AUTH)
    check(st == 400 and body["error"]["param"] == "max_tokens", f"max_tokens past ctx: {body}")
    st, _, body = s.post("/nowhere", {}, AUTH)
    check(st == 404 and "error" in body, f"an unknown path: {st}")

    # A full queue: one running, one waiting, the next refused.
    long_req = chat("Count to a thousand.", 300, ignore_eos=True)
    results = {}

    def run(name):
        results[name] = s.post("/v1/chat/completions", long_req, AUTH)

    first = threading.Thread(target=run, args=("first",))
    first.start()
    s.wait_metric("tessera_requests_running", lambda v: v == 1)
    second = threading.Thread(target=run, args=("second",))
    second.start()
    s.wait_metric("tessera_requests_waiting", lambda v: v == 1)
    st, hdr, body = s.post("/v1/chat/completions", chat("Hi", 4), AUTH)
    check(st == 429 and hdr.get("Retry-After") and body["error"]["type"] == "rate_limit_error",
          f"a full queue: {st} {hdr.get('Retry-After')}")
    first.join(timeout=300)
    second.join(timeout=300)
    check(results["first"][0] == 200 and results["second"][0] == 200,
          f"the queued ones complete: {results['first'][0]}, {results['second'][:1]}"
          f" {results['second'][2] if results['second'][0] != 200 else ''}")

    # A client that leaves mid-stream: its request stops and its blocks are freed at once.
    before = s.metrics()["tessera_generation_tokens_total"]
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/chat/completions",
                 body=json.dumps({**long_req, "max_tokens": 400, "stream": True}), headers=AUTH)
    r = conn.getresponse()
    for _ in range(4):
        r.fp.readline()
    check(s.wait_metric("tessera_kv_blocks_used", lambda v: v > 0, 10) > 0,
          "the stream holds KV blocks")
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    check(s.wait_metric("tessera_kv_blocks_used", lambda v: v == 0, 10) == 0,
          "its blocks are freed once it is gone")
    check(s.wait_metric("tessera_requests_running", lambda v: v == 0, 10) == 0, "nothing runs")
    time.sleep(0.5)
    made = s.metrics()["tessera_generation_tokens_total"] - before
    check(made < 300, f"it stopped after {made:.0f} of 400 tokens")
    st, _, _ = s.post("/v1/chat/completions", chat("Hi", 4), AUTH)
    check(st == 200, "the server goes on serving")
os.unlink(keys.name)

# --- The KV cache exhausted by long requests: preemption, then every one completes ----------
# 16 MiB hold 22 blocks of 32 tokens: two of the eight 300-token answers at a time.
prompts = [f"Tell a long story about the number {i}." for i in range(8)]
with Server(tessera, model, "--ctx", "512", "--kv-memory", "16MiB", "--max-batch", "8",
            kv_memory="16MiB") as s:
    out = [None] * 8

    def ask(i):
        out[i] = s.post("/v1/chat/completions", chat(prompts[i], 300))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    m = s.metrics()
    check(all(o and o[0] == 200 for o in out), "all eight complete")
    check(m["tessera_preemptions_total"] > 0,
          f"the cache ran out: {m['tessera_preemptions_total']:.0f} preemptions")
    check(s.wait_metric("tessera_kv_blocks_used", lambda v: v == 0) == 0,
          "no KV block held once idle")
    for i in (0, 5):
        want = generate_alone(tessera, model, prompts[i], 300)
        got = out[i][2]["choices"][0]["message"]["content"]
        check(got == want, f"request {i} equals tessera generate alone despite preemption")

# --- SIGTERM: drain, then exit 0 -------------------------------------------------------------
for grace, finish in (("30", "length"), ("0.3", "abort")):
    with Server(tessera, model, "--shutdown-grace", grace) as s:
        got = {}

        def streaming():
            got["r"] = s.stream("/v1/chat/completions",
                                chat("Count slowly.", 200, ignore_eos=True, stream=True))

        t = threading.Thread(target=streaming)
        t.start()
        s.wait_metric("tessera_generation_tokens_total", lambda v: v >= 3)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        st, _, _ = s.post("/v1/chat/completions", chat("Hi", 4), timeout=10)
        check(st == 503, f"grace {grace}: new work during the drain gets 503 (got {st})")
        t.join(timeout=120)
        status, events, done = got["r"]
        reasons = [c["finish_reason"] for e in events for c in e.get("choices", [])
                   if c.get("finish_reason")]
        check(status == 200 and done and reasons == [finish],
              f"grace {grace}: the running stream ends with {reasons} and [DONE]")
        check(s.proc.wait(timeout=60) == 0, f"grace {grace}: exit status 0")
check.done()
