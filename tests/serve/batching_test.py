#!/usr/bin/env python3
"""Continuous batching is exact: 16 concurrent greedy chat requests of different prompts and
lengths return the text each gives alone through `tessera generate`, while /metrics shows steps
that ran more than one sequence.
    batching_test.py TESSERA_BIN MODEL.gguf"""
import threading

from serve_util import Checks, Server, env_tessera_model, generate_alone

tessera, model = env_tessera_model()
check = Checks()
topics = ["cats", "the sea", "Paris", "bread", "rain", "music", "chess", "trees", "snow", "iron",
          "honey", "owls", "glass", "tea", "wind", "maps"]
prompts = [f"Tell me fact number {i} about {w}." for i, w in enumerate(topics)]
lengths = [20 + 7 * i for i in range(16)]

with Server(tessera, model, "--max-batch", "16") as s:
    results = [None] * 16

    def ask(i):
        results[i] = s.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": prompts[i]}],
                             "max_tokens": lengths[i], "temperature": 0})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    m = s.metrics()
    single = m.get('tessera_step_sequences_bucket{le="1"}', 0)
    steps = m.get("tessera_step_sequences_count", 0)
    check(steps > single, f"some of the {steps:.0f} steps ran more than one sequence "
                          f"({steps - single:.0f} did)")
    check(m.get('tessera_step_sequences_bucket{le="8"}', steps) < steps,
          "some steps ran more than 8 sequences")
    check(s.wait_metric("tessera_kv_blocks_used", lambda v: v == 0) == 0,
          "no KV block held once idle")

for i in range(16):
    status, _, body = results[i]
    if not check(status == 200, f"request {i}: HTTP {status}"):
        continue
    alone = generate_alone(tessera, model, prompts[i], lengths[i])
    got = body["choices"][0]["message"]["content"]
    check(got == alone, f"request {i} ({lengths[i]} tokens) equals tessera generate alone"
                        + ("" if got == alone else f": {got[:60]!r} vs {alone[:60]!r}"))
check.done()
