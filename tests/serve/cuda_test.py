#!/usr/bin/env python3
"""`tessera serve --device cuda` through the same engine loop and scheduler: eight concurrent
streamed requests complete, steps run several sequences, the KV blocks come back, and the
answers of greedy requests agree with the CPU server's in their first tokens (the kernels
differ in rounding, so not every token need agree). Skipped (77), with the reason, where the
build has no CUDA or the machine no GPU.
    cuda_test.py TESSERA_BIN MODEL.gguf"""
import sys
import threading

from serve_util import Checks, Server, env_tessera_model

tessera, model = env_tessera_model()
try:
    gpu = Server(tessera, model, "--device", "cuda", "--max-batch", "8", ready_s=300)
except RuntimeError as e:
    reason = [line for line in str(e).splitlines() if "[cuda]" in line]
    if reason:
        print("skipped:", reason[0])
        sys.exit(77)
    raise

check = Checks()
prompts = [f"Name {i + 2} animals that live in the sea." for i in range(8)]
body = lambda p: {"messages": [{"role": "user", "content": p}], "max_tokens": 32,
                  "temperature": 0, "stream": True}
with gpu as s:
    out = [None] * 8

    def ask(i):
        out[i] = s.stream("/v1/chat/completions", body(prompts[i]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    check(all(o and o[0] == 200 and o[2] for o in out), "eight streams complete with [DONE]")
    m = s.metrics()
    check(m["tessera_step_sequences_count"] > m['tessera_step_sequences_bucket{le="1"}'],
          "steps ran several sequences")
    check(s.wait_metric("tessera_kv_blocks_used", lambda v: v == 0) == 0, "blocks come back")
    gpu_text = ["".join(c["delta"].get("content", "") for e in o[1] for c in e["choices"])
                for o in out]
with Server(tessera, model) as s:
    cpu_text = ["".join(c["delta"].get("content", "") for e in s.stream(
        "/v1/chat/completions", body(p))[1] for c in e["choices"]) for p in prompts]
agree = sum(g[:16] == c[:16] for g, c in zip(gpu_text, cpu_text))
check(agree >= 6, f"{agree} of 8 greedy answers begin as the CPU's do")
check.done()
