#!/usr/bin/env bash
# A/B benchmark of two tessera binaries in one window: rounds alternate which binary runs first,
# every figure comes from the same commands, and scripts/ab_summary.py prints medians and ratios.
#   scripts/ab-bench.sh BASE_BIN NEW_BIN [ROUNDS] [OUT.jsonl]
# Cases: bench generate on the default SmolLM2 Q4_1 file and synthetic:1b:q4_0 (prefill 128
# tokens, decode 32) at 1 and 2 threads; bench train gpt2-small B=4 T=64 f32 and bf16 at 2
# threads.
set -euo pipefail
base=${1:?base binary}; new=${2:?new binary}; rounds=${3:-5}; out=${4:-ab.jsonl}
: > "$out"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
run_case() {  # label binary case args...
  local label=$1 bin=$2 case=$3; shift 3
  local line
  line=$("$bin" "$@" --json 2>/dev/null | tail -1)
  printf '{"build": "%s", "case": "%s", "result": %s}\n' "$label" "$case" "$line" >> "$out"
}
for r in $(seq 1 "$rounds"); do
  if (( r % 2 )); then order="base new"; else order="new base"; fi
  for label in $order; do
    bin=$base; [[ $label == new ]] && bin=$new
    for t in 1 2; do
      run_case "$label" "$bin" "smollm2-q4_1-t$t" bench generate -m "$model" --threads "$t" \
        --prompt 128 --gen 32 --reps 1 --batch 1
      run_case "$label" "$bin" "synthetic-1b-q4_0-t$t" bench generate -m synthetic:1b:q4_0 \
        --threads "$t" --prompt 128 --gen 32 --reps 1 --batch 1
    done
    run_case "$label" "$bin" "train-gpt2-small-b4-t64" bench train --model gpt2-small \
      --batch 4 --seq 64 --steps 3 --threads 2
    run_case "$label" "$bin" "train-gpt2-small-b4-t64-bf16" bench train --model gpt2-small \
      --batch 4 --seq 64 --steps 3 --threads 2 --precision bf16
  done
  echo "ab-bench: round $r of $rounds done" >&2
done
python3 "$(dirname "$0")/ab_summary.py" "$out"
