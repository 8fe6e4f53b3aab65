#!/usr/bin/env bash
# `tessera quantize` beside llama.cpp's llama-quantize on the same f16 file: each tensor's type
# and bytes (scripts/compare_gguf_tensors.py) and the perplexity of every file, all scored by the
# same program (tessera perplexity) on the same text. llama-quantize is built as in
# scripts/compare-llamacpp.sh (from the llama-cpp-python source package on PyPI).
#   scripts/compare-quantize.sh [SOURCE.gguf] [TEXT]
# SOURCE defaults to the SmolLM2 Q4_1 file, widened to f16 first (the common source of both
# quantizers); TEXT to the first 30 kB of the demo's fortunes corpus.
# Environment: LLAMACPP_PYPI_VERSION (0.3.36), WORK (/tmp/tessera-llamacpp), TESSERA
# (build/tessera), OUT (/tmp/tessera-quantize-compare), TYPES ("q4_0:Q4_0 q4_k_m:Q4_K_M").
set -euo pipefail
cd "$(dirname "$0")/.."
version=${LLAMACPP_PYPI_VERSION:-0.3.36}
work=${WORK:-/tmp/tessera-llamacpp}
tessera=${TESSERA:-build/tessera}
out=${OUT:-/tmp/tessera-quantize-compare}
types=${TYPES:-"q4_0:Q4_0 q4_k_m:Q4_K_M"}
source=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
text=${2:-}
mkdir -p "$out"
python3 -c "import gguf" 2>/dev/null || python3 -m pip install --quiet gguf

src=$work/llama_cpp_python-$version/vendor/llama.cpp
lq=$work/build/bin/llama-quantize
if [[ ! -x $lq ]]; then
  mkdir -p "$work"
  if [[ ! -d $src ]]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
    tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  fi
  [[ -f $work/build/CMakeCache.txt ]] ||
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA=OFF \
      > "$work/configure.log"
  cmake --build "$work/build" --target llama-quantize -j "$(nproc)" > "$work/build-quantize.log"
fi
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
