#!/usr/bin/env python3
"""Table of scripts/compare-llamacpp.sh's raw output: prefill and decode tokens/s of both engines
per file and thread count, and their ratios (Tessera / llama.cpp)."""
import json
import os
import sys

out = sys.argv[1]
ours = [json.loads(l) for l in open(os.path.join(out, "tessera.jsonl")) if l.strip()]
theirs = [json.loads(l) for l in open(os.path.join(out, "llama-bench.jsonl")) if l.strip()]


def llama(path, threads, prefill):
    for r in theirs:
        same = os.path.basename(r.get("model_filename", "")) == os.path.basename(path)
        if same and r.get("n_threads") == threads and (r.get("n_gen", 0) == 0) == prefill:
            return r["avg_ts"]
    return None


print("| file | threads | prefill: Tessera | llama.cpp | ratio | decode: Tessera | llama.cpp | ratio |")
print("|---|---|---|---|---|---|---|---|")
for r in ours:
    f, t = r["file"], r["threads"]
    p, d = r["prefill_tokens_per_s"], r["decode_tokens_per_s"]
    lp, ld = llama(f, t, True), llama(f, t, False)
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
    print(f"| {os.path.basename(f)} | {t} | {p:.1f} | {lp or 0:.1f} | {ratio(p, lp)} | {d:.1f} | "
          f"{ld or 0:.1f} | {ratio(d, ld)} |")
