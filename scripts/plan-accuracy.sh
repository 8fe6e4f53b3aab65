#!/usr/bin/env bash
# The planner against the engine on this machine: `tessera plan --check` for each model and
# context, batches 1, 4, 16 and 64, and one markdown table of predicted / measured (error) for
# peak memory, prefill and decode. The raw JSON of every run is kept beside the table.
#
#   scripts/plan-accuracy.sh [--threads N] [--gen N] [MODEL@CONTEXT,CONTEXT ...]
#
# MODELs: .gguf files, HF folders or synthetic:SIZE:TYPE; default: the SmolLM2 file at 512 and
# 4,096 tokens and the synthetic 1.1B in q4_0, q8_0 and f16 at 512 and 2,048 (its longest).
# Output: $OUT (default docs/plan-accuracy/<date>/), table.md and one <n>.json per run.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=2
gen=16
models=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --gen) gen="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    -*) echo "plan-accuracy.sh: unknown flag $1" >&2; exit 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
if [[ ${#models[@]} -eq 0 ]]; then
  models=(models/SmolLM2-135M-Instruct.Q4_1.gguf@512,4096 synthetic:1b:q4_0@512,2048
          synthetic:1b:q8_0@512,2048 synthetic:1b:f16@512,2048)
fi
bin=build/tessera
[[ -x $bin ]] || { echo "plan-accuracy.sh: build first (cmake --build build)" >&2; exit 1; }
out="${OUT:-docs/plan-accuracy/$(date -u +%Y-%m-%d)}"
mkdir -p "$out"
table="$out/table.md"
{
  echo "Commit $(git rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads; \`$0 --threads $threads --gen $gen ${models[*]}\`"
  echo
  echo "| model | context | peak memory | prefill tok/s | decode b=1 | b=4 | b=16 | b=64 |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$table"
n=0
for spec in "${models[@]}"; do
  m="${spec%@*}"
  [[ "$spec" == *@* ]] || { echo "plan-accuracy.sh: $spec: give MODEL@CONTEXT,..." >&2; exit 2; }
  IFS=, read -r -a ctx_list <<< "${spec##*@}"
  for c in "${ctx_list[@]}"; do
    n=$((n + 1))
    json="$out/$n.json"
    echo "plan-accuracy: $m, context $c" >&2
    "$bin" plan -m "$m" --context "$c" --batch 1,4,16,64 --check --gen "$gen" \
      --threads "$threads" --json > "$json"
    python3 - "$json" "$m" "$c" >> "$table" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
def cell(p, m, fmt):
    return f"{fmt.format(p)} / {fmt.format(m)} ({100 * (p - m) / m:+.1f}%)"
ck = j["check"]
row = [sys.argv[2].split("/")[-1], sys.argv[3],
       cell(ck["predicted_peak_rss"] / 1e9, ck["peak_rss"] / 1e9, "{:.2f} GB"),
       cell(j["prefill_tokens_per_s"], ck["batches"][0]["prefill_tokens_per_s"], "{:.0f}")]
for d, b in zip(j["decode"], ck["batches"]):
    row.append(cell(d["tokens_per_s"], b["decode_tokens_per_s"], "{:.1f}"))
print("| " + " | ".join(row) + " |")
EOF
  done
done
cat "$table"
