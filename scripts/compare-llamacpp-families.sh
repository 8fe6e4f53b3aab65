#!/usr/bin/env bash
# Greedy output of Tessera beside llama.cpp's on random-weight GGUF files of the model families
# (scripts/make_synthetic_family.py: a real tokenizer, random weights), and of the Hugging Face
# folder `tessera convert` makes of each file: the same text for every prompt, or the first
# difference shown. llama.cpp's `llama-simple` (greedy) is built by scripts/build-llamacpp.sh.
# Where the two differ on a mixture of experts, scripts/float64_reference.py decodes the prompt in
# float64 and says which of the two it agrees with, and how close the step was to a tie.
#   scripts/compare-llamacpp-families.sh [ARCH ...]
#   (default: llama qwen3 qwen3-yarn gemma3 smollm3 phi3 mixtral qwen3moe olmoe; qwen3-yarn is
#   qwen3 with YaRN scaling by 4 over a pretrained length of 64)
# Environment: OUT (/tmp/tessera-compare-families), N (32 tokens), TOKENIZER (the SmolLM2 file).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/tessera-compare-families}
n=${N:-32}
tok=${TOKENIZER:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
vocabs=${WORK:-/tmp/tessera-llamacpp}/llama_cpp_python-${LLAMACPP_PYPI_VERSION:-0.3.36}
vocabs=$vocabs/vendor/llama.cpp/models  # llama.cpp's tokenizer test vocabularies
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(llama qwen3 qwen3-yarn gemma3 smollm3 phi3 mixtral qwen3moe olmoe)
py=$root/.venv/bin/python3
[ -x "$py" ] || py=python3
tessera=$root/build/tessera
simple=$("$root/scripts/build-llamacpp.sh" llama-simple | tail -1)
libs=$(dirname "$simple")
mkdir -p "$out"
prompts=("The capital of France is" "Once upon a time" "def fibonacci(n):" "Water boils at")
fail=0
for name in "${archs[@]}"; do
  arch=${name%-yarn}
  for prec in f32 f16; do
    f=$out/$name-$prec.gguf
    extra=()
    [ "$name" != "$arch" ] && extra+=(--yarn 4)
    [[ $arch == qwen3* ]] && extra+=(--head-dim 96)  # heads wider than width / heads (Qwen3)
    [ "$arch" = olmoe ] && extra+=(--kv-heads 4)  # llama.cpp's olmoe has no grouped heads
    [ "$arch" = smollm3 ] && extra+=(--layers 8)  # layers 3 and 7 without RoPE
    # Phi-3's own (SentencePiece) vocabulary, from llama.cpp's tokenizer test files: llama.cpp's
    # phi3 loader looks up tokens of it.
    ftok=$tok
    [ "$arch" = phi3 ] && ftok=$vocabs/ggml-vocab-phi-3.gguf && extra+=(--longrope)
    # Gemma 3: eight layers (local 0-4 and 6-7 over 16 positions, 5 global), wide heads.
    [ "$arch" = gemma3 ] && extra+=(--layers 8 --head-dim 128 --kv-heads 1 --window 16)
    [ "$prec" = f16 ] && extra+=(--f16)
    "$py" "$root/scripts/make_synthetic_family.py" "$f" --arch "$arch" --tokenizer "$ftok" \
      "${extra[@]}" >/dev/null
    "$tessera" convert "$f" "$out/$name-$prec-hf" >/dev/null
    for p in "${prompts[@]}"; do
      theirs=$(LD_LIBRARY_PATH=$libs "$simple" -m "$f" -n "$n" "$p" 2>/dev/null)
      # llama-simple prints the prompt's tokens, a SentencePiece BOS as "<s>" and the first
      # word's piece with its space; Tessera prints the prompt as given.
      [[ $theirs == "<s> $p"* ]] && theirs=${theirs#"<s> "}
      for model in "$f" "$out/$name-$prec-hf"; do
        ours=$("$tessera" generate -m "$model" -p "$p" -n "$n" --temperature 0 --raw --threads 2 \
          2>/dev/null)
        kind=gguf
        [ -d "$model" ] && kind=hf
        if [ "$ours" = "$theirs" ]; then
          echo "same   $name $prec $kind: $p"
        else
          echo "DIFFER $name $prec $kind: $p"
          echo "  tessera:   $ours"
          echo "  llama.cpp: $theirs"
          fail=1
          if [[ $arch == mixtral || $arch == *moe || $name == *-yarn ]]; then
            ids=$("$tessera" tokenizer encode -m "$f" --text "$p")
            steps=$("$py" "$root/scripts/float64_reference.py" "$f" "$ids" "$n")
            text=$("$tessera" tokenizer decode -m "$f" --ids "$(echo "$steps" | tail -1)")
            for who in tessera llama.cpp; do
              [ "$who" = tessera ] && t=$ours || t=$theirs
              [ "$t" = "$text" ] && echo "  float64 reference: the same as $who"
            done
            log=$out/$arch-$prec-$kind-$(echo "$p" | tr -c 'A-Za-z0-9\n' _)-reference.txt
            echo "$steps" >"$log"
            echo "  (the reference's steps and margins: $log)"
          fi
        fi
      done
    done
  done
done
exit $fail
