#!/usr/bin/env python3
"""Validation-loss curves of two runs' train.csv side by side (Markdown), the relative gap at
every evaluation, and each run's median tokens/s. Exit status 1 when a gap exceeds --bound.
    compare_curves.py A/train.csv B/train.csv [--bound 0.01]"""
import argparse
import csv
import math
import statistics


def read(path):
    evals, tps = {}, []
    with open(path) as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            if row["val_loss"]:
                evals[step] = float(row["val_loss"])
            if row["tokens_per_s"]:
                tps.append(float(row["tokens_per_s"]))
    return evals, tps


ap = argparse.ArgumentParser()
ap.add_argument("a")
ap.add_argument("b")
ap.add_argument("--bound", type=float, default=0.01)
args = ap.parse_args()
a, tps_a = read(args.a)
b, tps_b = read(args.b)
steps = sorted(set(a) & set(b))
if not steps:
    raise SystemExit(f"no evaluation step common to {args.a} and {args.b}")
print(f"| step | val loss A | val loss B | (B - A) / A |")
print("|---|---|---|---|")
worst = 0.0
for s in steps:
    gap = (b[s] - a[s]) / a[s]
    worst = max(worst, abs(gap)) if math.isfinite(gap) else math.inf
    print(f"| {s} | {a[s]:.4f} | {b[s]:.4f} | {gap:+.2%} |")
print(f"\nA: {args.a}, B: {args.b}; largest gap {worst:.2%} (bound {args.bound:.0%})")
if tps_a and tps_b:
    ma, mb = statistics.median(tps_a), statistics.median(tps_b)
    print(f"median tokens/s: A {ma:.0f}, B {mb:.0f} (B/A {mb / ma:.2f})")
raise SystemExit(0 if worst <= args.bound else 1)
