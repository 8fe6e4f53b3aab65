#!/usr/bin/env python3
"""The CUDA issue's performance targets, read from a gpu-check bench.jsonl: for each target the
figures measured, the threshold, and MET / PARTLY / MISSED / NOT MEASURED, so a device run's summary says
at a glance where the backend stands. `targets.py --self-test` checks the reading on made-up
rows (ctest runs it; no GPU needed).

Targets (issue 4): GEMM bf16 8192^3 at >= 90% of cuBLAS in the same run; causal attention,
D=128, T=4096, bf16: forward >= 50% and backward >= 35% of the dense bf16 peak; batch-1 decode
of q4_0 / q8_0 1B-8B models at >= 75% of the measured HBM bandwidth; GPT-2 small training
(bf16, B=16, T=1024) at >= 45% model FLOP utilization.
"""
import json
import sys


def read_rows(lines):
    rows = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def number(x):
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def evaluate(rows):
    """Returns (target, threshold, [(label, value)], verdict) for each target."""
    out = []

    gemm = [(f"{r.get('shape', '8192^3')}", number(r.get("ours_over_cublas"))) for r in rows
            if r.get("bench") == "gemm_bf16_ratio" and r.get("M") == 8192 and r.get("N") == 8192
            and r.get("K") == 8192]
    out.append(("GEMM bf16 8192^3, ours / cuBLAS", 0.90, "all", gemm))

    def attention(pass_name):
        found = []
        for r in rows:
            name = r.get("name", "")
            shape = r.get("shape", "")
            if name in (f"flash_attention_{pass_name}", f"flash_attention_{pass_name}_wgmma") \
                    and "T=4096" in shape and "D=128" in shape:
                kernel = "wgmma" if name.endswith("_wgmma") else "mma.sync"
                found.append((kernel, number(r.get("peak_fraction"))))
        return found

    # Attention: the better kernel counts (it is the one to make the default).
    out.append(("attention forward D=128 T=4096 causal bf16, fraction of peak", 0.50, "best",
                attention("forward")))
    out.append(("attention backward D=128 T=4096 causal bf16, fraction of peak", 0.35, "best",
                attention("backward")))

    decode = []
    for r in rows:
        name = r.get("name", "")
        # The targets' runs only, not the A/B reruns without PDL or graphs.
        if name.startswith("generate ") and ("q4_0" in name or "q8_0" in name) \
                and "no " not in name:
            decode.append((name[len("generate "):], number(r.get("decode_bandwidth_fraction"))))
    out.append(("batch-1 decode, fraction of measured HBM bandwidth", 0.75, "all", decode))

    train = [(r.get("name", "")[len("train "):] or "gpt2-small", number(r.get("mfu")))
             for r in rows if r.get("name", "").startswith("train gpt2-small")
             and "recompute" not in r.get("name", "")]
    out.append(("GPT-2 small training bf16 B=16 T=1024, MFU", 0.45, "best", train))

    # "all": every measured figure must reach the threshold (PARTLY when only some do); "best":
    # the best one must.
    result = []
    for target, threshold, mode, figures in out:
        values = [v for _, v in figures if v is not None]
        reached = [v >= threshold for v in values]
        if not values:
            verdict = "NOT MEASURED"
        elif mode == "best":
            verdict = "MET" if any(reached) else "MISSED"
        elif all(reached):
            verdict = "MET"
        else:
            verdict = "PARTLY" if any(reached) else "MISSED"
        result.append((target, threshold, figures, verdict))
    return result


def report(rows):
    lines = []
    for target, threshold, figures, verdict in evaluate(rows):
        shown = ", ".join(f"{label} {value:.3f}" if value is not None else f"{label} n/a"
                          for label, value in figures) or "no figure"
        lines.append(f"target {target} >= {threshold:.2f}: {verdict} ({shown})")
    return lines


def self_test():
    rows = read_rows([
        '{"bench":"gemm_bf16_ratio","shape":"8192^3","M":8192,"N":8192,"K":8192,'
        '"ours_over_cublas":0.97}',
        '{"bench":"gemm_bf16_ratio","shape":"small","M":64,"N":64,"K":64,"ours_over_cublas":0.1}',
        '{"name": "flash_attention_forward", "shape": "B=4 H=32 T=4096 D=128 causal bf16", '
        '"peak_fraction": 0.38}',
        '{"name": "flash_attention_forward_wgmma", "shape": "B=4 H=32 T=4096 D=128 causal bf16", '
        '"peak_fraction": 0.55}',
        '{"name": "flash_attention_forward", "shape": "B=4 H=32 T=1024 D=128 causal bf16", '
        '"peak_fraction": 0.99}',
        '{"name": "flash_attention_backward", "shape": "B=4 H=32 T=4096 D=128 causal bf16", '
        '"peak_fraction": null}',
        '{"name": "generate 1b q4_0", "decode_bandwidth_fraction": 0.71}',
        '{"name": "generate 8b q8_0", "decode_bandwidth_fraction": 0.80}',
        '{"name": "generate 1b q4_0 no PDL", "decode_bandwidth_fraction": 0.99}',
        'not json',
        '{"name": "train gpt2-small recompute block", "mfu": 0.9}',
    ])
    got = {t: (v, [f for f in figs]) for t, _, figs, v in evaluate(rows)}
    names = [t for t, _, _, _ in evaluate(rows)]
    checks = [
        (got[names[0]][0] == "MET", "GEMM ratio 0.97 meets 0.90; the small shape is ignored"),
        (got[names[1]][0] == "MET", "forward: the best kernel (wgmma 0.55) counts; T=1024 ignored"),
        (len(got[names[1]][1]) == 2, "forward lists both kernels"),
        (got[names[2]][0] == "NOT MEASURED", "backward with a null fraction is not measured"),
        (got[names[3]][0] == "PARTLY", "decode 0.80 meets, 0.71 misses; the no-PDL rerun ignored"),
        (got[names[4]][0] == "NOT MEASURED", "training: the recompute run is not the target's"),
    ]
    failed = [why for ok, why in checks if not ok]
    for why in failed:
        print(f"targets self-test FAILED: {why}")
    if len(report(rows)) != 5:
        failed.append("report has one line per target")
        print("targets self-test FAILED: report has one line per target")
    if not failed:
        print(f"targets self-test: {len(checks) + 1} checks passed")
    return 1 if failed else 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        return self_test()
    if len(sys.argv) != 2:
        print("usage: targets.py BENCH_JSONL | --self-test", file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            rows = read_rows(f)
    except OSError as e:
        print(f"targets.py: cannot read {sys.argv[1]}: {e.strerror}", file=sys.stderr)
        return 2
    for line in report(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
