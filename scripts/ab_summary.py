#!/usr/bin/env python3
"""Medians and new/base ratios of scripts/ab-bench.sh's JSON lines (one table, Markdown)."""
import json
import statistics
import sys
from collections import defaultdict

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
vals = defaultdict(list)
for r in rows:
    res, case, b = r["result"], r["case"], r["build"]
    if "median_ms" in res:
        vals[(case, "s/step (lower is better)")].append((b, res["median_ms"] / 1e3))
    else:
        vals[(case, "prefill tokens/s")].append((b, res["prefill_tokens_per_s"]))
        vals[(case, "decode tokens/s")].append((b, res["decode_tokens_per_s"]))
print("| case | figure | base median | new median | new/base | runs |")
print("|---|---|---|---|---|---|")
for (case, fig), v in vals.items():
    base = [x for b, x in v if b == "base"]
    new = [x for b, x in v if b == "new"]
    if not base or not new:
        continue
    mb, mn = statistics.median(base), statistics.median(new)
    spread = lambda xs: f"{min(xs):.3g}-{max(xs):.3g}"
    print(f"| {case} | {fig} | {mb:.3g} ({spread(base)}) | {mn:.3g} ({spread(new)}) | "
          f"{mn / mb:.3f} | {len(base)}+{len(new)} |")
