#!/usr/bin/env bash
# Trains the same small GPT-2 on the demo corpus twice, --precision f32 and --precision bf16 (same
# seed, data order and schedule), and prints both validation-loss curves and their relative gap
# at every evaluation (scripts/compare_curves.py).
#   scripts/bf16-vs-f32.sh [TESSERA_BIN] [STEPS] [OUT_DIR]
set -euo pipefail
tessera=${1:-build/tessera}
steps=${2:-600}
out=${3:-runs/bf16-vs-f32}
mkdir -p "$out"

corpus="$out/corpus.txt"
if [ ! -s "$corpus" ]; then
  # The demo's corpus: every fortune file, '%' lines separating entries.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat > "$corpus"
fi
[ -s "$out/tok.json" ] || "$tessera" tokenizer train --vocab 4096 --in "$corpus" --out "$out/tok.json"
[ -d "$out/data" ] || "$tessera" prepare --tokenizer "$out/tok.json" --in "$corpus" \
  --out "$out/data" --val-fraction 0.02

for p in f32 bf16; do
  rm -rf "$out/run-$p"
  echo "== gpt2-tiny, $steps steps, --precision $p" >&2
  "$tessera" train --model gpt2-tiny --data "$out/data" --out "$out/run-$p" --batch 16 --seq 128 \
    --steps "$steps" --lr 2e-3 --warmup 50 --schedule cosine --eval-every 50 --eval-batches 16 \
    --precision "$p" --seed 1 --quiet
done
python3 "$(dirname "$0")/compare_curves.py" "$out/run-f32/train.csv" "$out/run-bf16/train.csv"
