#!/usr/bin/env python3
"""The official `openai` Python client against `tessera serve` with the default model: chat and
completions, streamed and whole, n, stop strings, a fixed seed giving the same output twice,
usage, log-probabilities, embeddings, models, and error shapes and statuses. Skipped (77)
without the openai package (scripts/install-deps.sh puts it in .venv).
    openai_client_test.py TESSERA_BIN MODEL.gguf"""
import base64
import math
import struct
import sys

from serve_util import Checks, Server, env_tessera_model

try:
    import openai
except ImportError:
    print("the openai package is not installed: skipped")
    sys.exit(77)

tessera, model = env_tessera_model()
check = Checks()
NAME = "smollm2"
msgs = [{"role": "user", "content": "Write one sentence about the sea."}]

with Server(tessera, model, "--model-name", NAME, "--max-batch", "8") as s:
    c = openai.OpenAI(base_url=s.url() + "/v1", api_key="none", max_retries=0, timeout=300)

    check([m.id for m in c.models.list().data] == [NAME], "models.list names the model")

    whole = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=40, temperature=0.9,
                                      seed=42)
    again = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=40, temperature=0.9,
                                      seed=42)
    text = whole.choices[0].message.content
    check(len(text) > 0 and whole.choices[0].message.role == "assistant", f"chat: {text!r}")
    check(again.choices[0].message.content == text, "the same seed gives the same text")
    u = whole.usage
    check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 40
          and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
    check(whole.choices[0].finish_reason in ("stop", "length"), "finish_reason")

    chunks = list(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=40,
                                            temperature=0.9, seed=42, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(streamed == text, "streaming gives the same text as a whole response")
    check(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    check(finals[-1] == whole.choices[0].finish_reason, "the last choice chunk has finish_reason")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == u.completion_tokens
          and not chunks[-1].choices, "include_usage: a last chunk with usage and no choices")

    many = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=20, temperature=1.0,
                                     seed=7, n=3)
    check(sorted(ch.index for ch in many.choices) == [0, 1, 2], "n=3 gives three choices")
    check(len({ch.message.content for ch in many.choices}) > 1, "the samples differ")
    check(many.usage.prompt_tokens == u.prompt_tokens, "the prompt counts once")
    # Sample i of n draws with seed + i: the same as a single request with that seed.
    singles = [c.chat.completions.create(model=NAME, messages=msgs, max_tokens=20,
                                         temperature=1.0, seed=7 + i) for i in range(3)]
    for i, one in enumerate(singles):
        mine = [ch for ch in many.choices if ch.index == i][0]
        check(one.choices[0].message.content == mine.message.content,
              f"choice {i} equals a single request with seed {7 + i}")
    check(many.usage.completion_tokens == sum(x.usage.completion_tokens for x in singles),
          "usage counts every choice's tokens")

    greedy = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=40, temperature=0)
    g = greedy.choices[0].message.content
    cut = g.split()[3] if len(g.split()) > 4 else g[5:8]
    stopped = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=40, temperature=0,
                                        stop=[cut])
    check(stopped.choices[0].message.content == g[:g.find(cut)]
          and stopped.choices[0].finish_reason == "stop", f"stop at {cut!r}")

    lp = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=5, temperature=0,
                                   logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    check(len(content) == 5 and all(e.logprob <= 0 for e in content), "five token logprobs")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
              and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in content),
          "greedy tokens are their top logprob, best first")
    check("".join(e.token for e in content) == lp.choices[0].message.content,
          "the logprob tokens spell the text")

    comp = c.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8,
                                temperature=0)
    check(len(comp.choices[0].text) > 0, f"completion: {comp.choices[0].text!r}")
    comp_s = "".join(ch.choices[0].text for ch in c.completions.create(
        model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    check(comp_s == comp.choices[0].text, "a streamed completion equals the whole one")
    default = c.completions.create(model=NAME, prompt="Once upon a time", temperature=0,
                                   extra_body={"ignore_eos": True})
    check(default.usage.completion_tokens == 16, "completions default to 16 tokens (ignore_eos)")
    clp = c.completions.create(model=NAME, prompt="One, two,", max_tokens=3, temperature=0,
                               logprobs=2)
    check(len(clp.choices[0].logprobs.tokens) == 3 and len(clp.choices[0].logprobs.top_logprobs[0])
          == 2, "completion logprobs")

    e1 = c.embeddings.create(model=NAME, input=["the sea", "the sea", "a cat"])
    vecs = [d.embedding for d in e1.data]
    check(all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vecs), "unit vectors")
    check(vecs[0] == vecs[1] and vecs[0] != vecs[2], "same text, same vector")
    ef = c.embeddings.create(model=NAME, input="a cat", encoding_format="float")
    check(max(abs(a - b) for a, b in zip(ef.data[0].embedding, vecs[2])) == 0,
          "float and base64 encodings agree")
    check(e1.usage.prompt_tokens > 0, "embedding usage")

    # Errors: OpenAI's JSON with the right status, the field named.
    try:
        c.chat.completions.create(model=NAME, messages=msgs, temperature=5)
        check(False, "temperature 5 refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "temperature", f"400: {e.body}")
    try:
        c.chat.completions.create(model="gpt-4", messages=msgs)
        check(False, "an unknown model refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and e.body.get("param") == "model", f"404: {e.body}")
    try:
        c.chat.completions.create(model=NAME, messages=msgs,
                                  tools=[{"type": "function", "function": {"name": "f"}}])
        check(False, "tools refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "tools", f"tools: {e.body}")
    try:
        c.chat.completions.create(model=NAME, messages=msgs, max_tokens=100000)
        check(False, "max_tokens past the context refused")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "max_tokens", f"context: {e.body}")
    check(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=3).usage
          .completion_tokens <= 3, "the server goes on after errors")
check.done()
