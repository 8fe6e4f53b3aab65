#!/usr/bin/env bash
# Builds one llama.cpp tool (llama-bench, llama-quantize, ...) from the llama.cpp tree vendored in
# the llama-cpp-python source package on PyPI, once: a yardstick for the comparison scripts, never
# a dependency of Tessera. Native SIMD, no network at build time, no GPU.
#   scripts/build-llamacpp.sh TARGET
# Environment: LLAMACPP_PYPI_VERSION (0.3.36), WORK (/tmp/tessera-llamacpp). Prints the binary.
set -euo pipefail
target=${1:?llama.cpp target, e.g. llama-bench}
version=${LLAMACPP_PYPI_VERSION:-0.3.36}
work=${WORK:-/tmp/tessera-llamacpp}
src=$work/llama_cpp_python-$version/vendor/llama.cpp
bin=$work/build/bin/$target
if [[ ! -x $bin ]]; then
  mkdir -p "$work"
  if [[ ! -d $src ]]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
    tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  fi
  [[ -f $work/build/CMakeCache.txt ]] ||
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA=OFF \
      > "$work/configure.log"
  cmake --build "$work/build" --target "$target" -j "$(nproc)" > "$work/build-$target.log"
fi
echo "$bin"
