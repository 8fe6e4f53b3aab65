#!/usr/bin/env bash
# `tessera quantize` beside llama.cpp's llama-quantize on the same f16 file: each tensor's type
# and bytes (scripts/compare_gguf_tensors.py) and the perplexity of every file, all scored by the
# same program (tessera perplexity) on the same text. llama-quantize is built by
# scripts/build-llamacpp.sh (from the llama-cpp-python source package on PyPI).
#   scripts/compare-quantize.sh [SOURCE.gguf] [TEXT]
# SOURCE defaults to the SmolLM2 Q4_1 file, widened to f16 first (the common source of both
# quantizers); TEXT to the first 30 kB of the demo's fortunes corpus.
# Environment: LLAMACPP_PYPI_VERSION (0.3.36), WORK (/tmp/tessera-llamacpp), TESSERA
# (build/tessera), OUT (/tmp/tessera-quantize-compare), TYPES ("q4_0:Q4_0 q4_k_m:Q4_K_M").
set -euo pipefail
cd "$(dirname "$0")/.."
work=${WORK:-/tmp/tessera-llamacpp}
tessera=${TESSERA:-build/tessera}
out=${OUT:-/tmp/tessera-quantize-compare}
types=${TYPES:-"q4_0:Q4_0 q4_k_m:Q4_K_M"}
source=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
text=${2:-}
mkdir -p "$out"
python3 -c "import gguf" 2>/dev/null || python3 -m pip install --quiet gguf

lq=$(scripts/build-llamacpp.sh llama-quantize)
export LD_LIBRARY_PATH=$work/build/bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [[ -z $text ]]; then
  text=$out/text.txt
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat \
    > "$out/corpus.txt"
  head -c 30000 "$out/corpus.txt" > "$text"
fi
f16=$out/source-f16.gguf
"$tessera" quantize "$source" "$f16" --type f16 --quiet
ppl() { "$tessera" perplexity -m "$1" -f "$text" --ctx 512 2>/dev/null | tail -1; }
echo "| file | perplexity |"
echo "|---|---|"
echo "| f16 source | $(ppl "$f16") |"
for pair in $types; do
  ours=${pair%%:*} theirs=${pair##*:}
  "$tessera" quantize "$f16" "$out/tessera-$ours.gguf" --type "$ours" --quiet > /dev/null
  "$lq" "$f16" "$out/llama-$theirs.gguf" "$theirs" > "$out/llama-quantize-$theirs.log" 2>&1
  echo "| tessera --type $ours | $(ppl "$out/tessera-$ours.gguf") |"
  echo "| llama-quantize $theirs | $(ppl "$out/llama-$theirs.gguf") |"
  python3 scripts/compare_gguf_tensors.py "$out/tessera-$ours.gguf" "$out/llama-$theirs.gguf" |
    tail -1 | sed "s/^/  tensors ($ours vs $theirs): /" >&2
done
