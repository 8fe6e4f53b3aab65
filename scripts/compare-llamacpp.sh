#!/usr/bin/env bash
# Tessera beside llama.cpp on the same GGUF files and thread counts, in one window. llama.cpp is
# the yardstick the user builds here from a public package (the llama.cpp tree vendored in the
# llama-cpp-python source package on PyPI), never a dependency of Tessera.
#   scripts/compare-llamacpp.sh [MODEL.gguf ...]       (default: the SmolLM2 Q4_1 file)
# Environment: LLAMACPP_PYPI_VERSION (0.3.36), WORK (/tmp/tessera-llamacpp), THREADS ("1 2"),
# PROMPT (512), GEN (64), REPS (2), TESSERA (build/tessera), OUT (docs/compare/<UTC date>).
# Writes every raw output line to $OUT (tessera.jsonl, llama-bench.jsonl, build and machine
# facts) and prints the table of scripts/compare_llamacpp_summary.py, also saved as table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${LLAMACPP_PYPI_VERSION:-0.3.36}
threads=${THREADS:-"1 2"}
prompt=${PROMPT:-512}
gen=${GEN:-64}
reps=${REPS:-2}
tessera=${TESSERA:-build/tessera}
out=${OUT:-docs/compare/$(date -u +%Y-%m-%d)}
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(models/SmolLM2-135M-Instruct.Q4_1.gguf)
[[ -x $tessera ]] || { echo "compare-llamacpp: $tessera not built (make build)" >&2; exit 1; }
for m in "${models[@]}"; do [[ -f $m ]] || { echo "compare-llamacpp: no file $m" >&2; exit 1; }; done

bench=$(scripts/build-llamacpp.sh llama-bench)

mkdir -p "$out"
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "cpu_flags: $(grep -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "tessera_commit: $(git rev-parse --short HEAD)"
  echo "llamacpp: llama-cpp-python $version source package (its commit: build_commit in llama-bench.jsonl)"
  echo "command: scripts/compare-llamacpp.sh ${models[*]} (THREADS='$threads' PROMPT=$prompt GEN=$gen REPS=$reps)"
} > "$out/machine.txt"
: > "$out/tessera.jsonl"
: > "$out/llama-bench.jsonl"
for m in "${models[@]}"; do
  for t in $threads; do
    "$tessera" bench generate -m "$m" --threads "$t" --prompt "$prompt" --gen "$gen" \
      --reps "$reps" --batch 1 --json | tail -1 | sed "s|^{|{\"file\": \"$m\", |" >> "$out/tessera.jsonl"
    "$bench" -m "$m" -t "$t" -p "$prompt" -n 0 -r "$reps" -o jsonl >> "$out/llama-bench.jsonl"
    "$bench" -m "$m" -t "$t" -p 0 -n "$gen" -d "$prompt" -r "$reps" -o jsonl \
      >> "$out/llama-bench.jsonl"
  done
done
python3 scripts/compare_llamacpp_summary.py "$out" | tee "$out/table.md"
