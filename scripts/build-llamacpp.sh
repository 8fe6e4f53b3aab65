#!/usr/bin/env bash
# Builds one llama.cpp tool (llama-bench, llama-quantize, ...) from the llama.cpp tree vendored in
# the llama-cpp-python source package on PyPI, once: a yardstick for the comparison scripts, never
# a dependency of Tessera. Native SIMD, no network at build time, no GPU.
#   scripts/build-llamacpp.sh TARGET
# Every build leaves AMX out unless LLAMACPP_AMX=1 (ggml's AMX matmul faults in the VMs used here:
# SIGSEGV on ldtilecfg, or SIGILL in llama-server's warm-up and llama-perplexity's first chunk,
# while the rest of -march=native is kept). TARGET=llama-server builds in its own folder
# ($WORK/build-server) with the server enabled, its web UI left empty (no npm, no download of
# prebuilt assets), without OpenSSL; every other target shares
# $WORK/build, configured with the server off as before; TARGET=llama-finetune, llama-simple or
# llama-perplexity build in $WORK/build-examples with the examples enabled.
# Environment: LLAMACPP_PYPI_VERSION (0.3.36), WORK (/tmp/tessera-llamacpp), LLAMACPP_AMX (0).
# Prints the binary.
set -euo pipefail
target=${1:?llama.cpp target, e.g. llama-bench}
version=${LLAMACPP_PYPI_VERSION:-0.3.36}
work=${WORK:-/tmp/tessera-llamacpp}
src=$work/llama_cpp_python-$version/vendor/llama.cpp
build=$work/build
server=OFF
examples=OFF
extra=()
if [[ $target == llama-finetune || $target == llama-simple || $target == llama-perplexity ]]; then
  build=$work/build-examples
  examples=ON
fi
if [[ $target == llama-server ]]; then
  build=$work/build-server
  server=ON
  extra=(-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF)
fi
if [[ ${LLAMACPP_AMX:-0} != 1 ]]; then
  noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  extra+=("-DCMAKE_C_FLAGS=$noamx" "-DCMAKE_CXX_FLAGS=$noamx")
fi
bin=$build/bin/$target
if [[ ! -x $bin ]]; then
  mkdir -p "$work"
  if [[ ! -d $src ]]; then
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
    tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
  fi
  [[ -f $build/CMakeCache.txt ]] ||
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=$examples -DLLAMA_BUILD_SERVER=$server -DGGML_CUDA=OFF \
      "${extra[@]}" > "$work/configure-$(basename "$build").log" 2>&1 ||
      { tail -30 "$work/configure-$(basename "$build").log" >&2; exit 1; }
  # Compiler warnings go to the log with the rest; its tail is shown when the build fails.
  cmake --build "$build" --target "$target" -j "$(nproc)" > "$work/build-$target.log" 2>&1 ||
    { tail -30 "$work/build-$target.log" >&2; exit 1; }
fi
echo "$bin"
