#!/usr/bin/env python3
"""The prefix cache: a second request sharing a ~1,000-token system prompt reports the hit
(usage.prompt_tokens_details.cached_tokens, /metrics) and runs only the rest of its prompt, and
both answers equal `tessera generate` without any cache.
    prefix_cache_test.py TESSERA_BIN MODEL.gguf"""
from serve_util import Checks, Server, env_tessera_model, generate_alone

tessera, model = env_tessera_model()
check = Checks()
words = ("the engine keeps every key and value of the prompt in blocks of the cache and a later "
         "request that starts with the same words takes those blocks instead of running them "
         "again ").split()
system = " ".join(words[i % len(words)] for i in range(970))  # about 1,000 tokens
questions = ["What does the engine keep?", "Which blocks does a later request take?"]

with Server(tessera, model, "--ctx", "2048") as s:
    answers = []
    for q in questions:
        status, _, body = s.post("/v1/chat/completions",
                                 {"messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": q}],
                                  "max_tokens": 24, "temperature": 0})
        check(status == 200, f"HTTP {status}")
        answers.append(body)
    first, second = (a["usage"] for a in answers)
    check(first["prompt_tokens"] >= 900, f"the prompt has {first['prompt_tokens']} tokens")
    check(first["prompt_tokens_details"]["cached_tokens"] == 0, "the first request runs it all")
    cached = second["prompt_tokens_details"]["cached_tokens"]
    check(cached >= first["prompt_tokens"] - 64,
          f"the second takes {cached} of its {second['prompt_tokens']} prompt tokens from the "
          "cache (all full blocks of the shared prefix)")
    m = s.metrics()
    check(m["tessera_prefix_cache_hit_tokens_total"] == cached, "/metrics counts the hit")
    check(m["tessera_computed_prompt_tokens_total"]
          == first["prompt_tokens"] + second["prompt_tokens"] - cached,
          "only the rest of the second prompt ran through the model")

for q, a in zip(questions, answers):
    want = generate_alone(tessera, model, q, 24, system=system)
    got = a["choices"][0]["message"]["content"]
    check(got == want, f"{q!r}: equals tessera generate without a cache"
                       + ("" if got == want else f": {got!r} vs {want!r}"))
check.done()
