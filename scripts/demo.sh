#!/usr/bin/env bash
# The main job (`make run`): (1) run the default model (SmolLM2-135M-Instruct, fetched by
# scripts/install-deps.sh) on a fixed chat prompt, printing its answer and speed, and measure
# where decode sits on the memory roofline; (2) train a byte-level BPE tokenizer and a small
# GPT-2 on the fortunes corpus (quotations Debian's `fortunes` package installs), with samples
# before and after training and the loss curve written as SVG.
set -euo pipefail
tessera=${1:-build/tessera}
out=${DEMO_OUT:-runs/demo}
steps=${DEMO_STEPS:-600}
model=${DEMO_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p "$out"

echo "== chat with $model (greedy)"
"$tessera" generate -m "$model" -p "What is the capital of France, and what is it famous for?" \
  -n 96 --temperature 0
echo "== generation speed (tessera bench generate)"
"$tessera" bench generate -m "$model" --prompt 128 --gen 64 --reps 2 --batch 1,4,16

corpus="$out/corpus.txt"
if [ ! -s "$corpus" ]; then
  # Every fortune file (not the .dat indexes or .u8 links), with '%' lines separating entries.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat > "$corpus"
fi
echo "== corpus: $(wc -c < "$corpus") bytes from /usr/share/games/fortunes"

echo "== machine peaks (tessera probe)"
"$tessera" probe

echo "== tokenizer"
[ -s "$out/tok.json" ] || "$tessera" tokenizer train --vocab 4096 --in "$corpus" --out "$out/tok.json"

echo "== token shards"
"$tessera" prepare --tokenizer "$out/tok.json" --in "$corpus" --out "$out/data" --val-fraction 0.02

rm -rf "$out/run"
echo "== sample before training (random weights)"
# --steps 0 writes the initialized model and the run's options; the resume below trains it.
"$tessera" train --model gpt2-tiny --data "$out/data" --batch 16 --seq 128 --steps 0 \
  --lr 2e-3 --warmup 50 --schedule cosine --eval-every 100 --early-stop 5 \
  --checkpoint-every 200 --threads 0 --out "$out/run" > /dev/null
"$tessera" sample --ckpt "$out/run" --prompt "The meaning of life is" --max-tokens 40 \
  --temperature 0.8 --seed 1
echo

echo "== training gpt2-tiny for $steps steps"
"$tessera" train --resume "$out/run" --steps "$steps"

echo "== sample after training"
"$tessera" sample --ckpt "$out/run" --prompt "The meaning of life is" --max-tokens 60 \
  --temperature 0.8 --seed 1
echo
echo "== loss curve: $out/run/loss.svg, log: $out/run/train.csv"
