#!/usr/bin/env bash
# Full fine-tuning speed beside llama.cpp's llama-finetune (examples/training, built from the
# llama-cpp-python source package by scripts/build-llamacpp.sh): the same f32 GGUF, the same
# text, windows of the same context, one window per optimizer step (AdamW), the same threads.
# Prints both engines' training tokens/s and their ratio; raw output kept in $OUT.
#
#   scripts/compare-llamacpp-finetune.sh MODEL-f32.gguf CORPUS.txt [--ctx 256] [--threads 2]
#                                        [--bytes 12000]
#
# --bytes: the corpus is cut to its first N bytes, so llama-finetune's one epoch (windows of
# --ctx tokens at a stride of half of it, 5% held out) stays short. Tessera trains as many steps
# as llama.cpp trained windows, on its own windows of the same length, and its tokens/s is the
# median of its steps after the first (train.csv); llama.cpp's is the windows it trained times
# the context over the training time its progress line reports (whole seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?an f32 GGUF (tessera quantize IN OUT --type f32 --pure)}
corpus=${2:?a text file}
shift 2
ctx=256
threads=2
bytes=12000
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ctx) ctx="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --bytes) bytes="$2"; shift 2 ;;
    *) echo "compare-llamacpp-finetune.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
out="${OUT:-/tmp/tessera-compare-finetune}"
rm -rf "$out"
mkdir -p "$out"
head -c "$bytes" "$corpus" > "$out/corpus.txt"
lf=$(scripts/build-llamacpp.sh llama-finetune)

# llama.cpp: one epoch over the text.
"$lf" -m "$model" -f "$out/corpus.txt" -c "$ctx" -b "$ctx" -ub "$ctx" -t "$threads" \
  --epochs 1 -o "$out/llamacpp-tuned.gguf" > "$out/llamacpp.log" 2>&1
line=$(tr '\r' '\n' < "$out/llamacpp.log" | grep '^train: ' | tail -1)
windows=$(sed -E 's/.*data=0*([0-9]+)\/.*/\1/' <<< "$line")
hms=$(sed -E 's/.* t=([0-9:]+) .*/\1/' <<< "$line")
secs=$(awk -F: '{print $1 * 3600 + $2 * 60 + $3}' <<< "$hms")
llama_tps=$(awk -v w="$windows" -v c="$ctx" -v s="$secs" 'BEGIN {printf "%.1f", w * c / s}')

# Tessera: the same number of steps of one window each, from the same file.
build/tessera prepare --tokenizer "$model" --in "$out/corpus.txt" --out "$out/data" \
  --seq "$ctx" --val-fraction 0.2 > "$out/prepare.log"
build/tessera train --init-from "$model" --data "$out/data" --out "$out/run" --batch 1 \
  --seq "$ctx" --steps "$windows" --precision f32 --lr 1e-5 --warmup 0 --eval-every 0 \
  --threads "$threads" --log-every 1 > "$out/tessera.log" 2>&1
ours_tps=$(awk -F, 'NR > 2 {print $5}' "$out/run/train.csv" | sort -g |
  awk '{v[NR] = $1} END {printf "%.1f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')

{
  echo "model $model, context $ctx, $threads threads, one window a step, f32, AdamW"
  echo "llama-finetune: $windows windows in $secs s: $llama_tps tokens/s"
  echo "tessera train:  median of steps 2..$windows: $ours_tps tokens/s"
  awk -v a="$ours_tps" -v b="$llama_tps" 'BEGIN {printf "ratio: %.2fx\n", a / b}'
} | tee "$out/summary.txt"
