#!/usr/bin/env bash
# Builds the libFuzzer targets (clang; ASan + UBSan + coverage over the whole library) and runs
# each for a bounded time over a copy of its seed corpus; exits non-zero if any target fails.
# Usage: scripts/fuzz.sh [build-dir (default build-fuzz)]
#   FUZZ_SECONDS=60   seconds per target
#   FUZZ_TARGETS="gguf safetensors tokenizer_json jinja api_request"
#   FUZZ_BUILD_JOBS=2 ninja -j
# Crash reproducers land in fuzz/crashes/<target>-crash-<sha1>; rerun one with
#   <build-dir>/fuzz/<target>_fuzz fuzz/crashes/<file>
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-60}
targets=${FUZZ_TARGETS:-"gguf safetensors tokenizer_json jinja api_request"}
build_jobs=${FUZZ_BUILD_JOBS:-2}

# Coverage instrumentation on the library too (fuzzer-no-link), sanitizers through the project's
# option (which also makes every UBSan report fatal). Warnings are not errors here: a clang-only
# warning in someone's file must not stop fuzzing; the normal GCC build enforces -Werror.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTESSERA_FUZZ=ON -DTESSERA_CUDA=off -DTESSERA_BENCH=OFF -DTESSERA_WERROR=OFF \
  -DTESSERA_SANITIZE=address,undefined -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link" \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; echo "fuzz: configure failed"; exit 2; }
bins=()
for t in $targets; do bins+=("${t}_fuzz"); done
ninja -C "$build" -j"$build_jobs" "${bins[@]}" || { echo "fuzz: build failed"; exit 2; }

mkdir -p "$root/fuzz/crashes"
status=0
summary=()
for t in $targets; do
  seeds="$root/fuzz/corpus/$t"
  work="$build/fuzz/work/$t"
  log="$build/fuzz/$t.log"
  rm -rf "$work" && mkdir -p "$work"
  [ -d "$seeds" ] && cp "$seeds"/* "$work"/ 2>/dev/null
  dict=()
  [ -f "$root/fuzz/$t.dict" ] && dict=(-dict="$root/fuzz/$t.dict")
  echo "fuzz: $t for ${seconds}s (log $log)"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a hostile size field that
  # makes a reader allocate gigabytes is a bug too.
  "$build/fuzz/${t}_fuzz" "$work" "${dict[@]}" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$root/fuzz/crashes/$t-" \
    >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 || true)
  corp=$(ls "$work" | wc -l)
  if [ "$rc" -ne 0 ]; then
    status=1
    crash=$(grep -o "Test unit written to .*" "$log" | tail -n 1 | sed 's/Test unit written to //')
    summary+=("$t: FAILED (exit $rc) execs ${execs:-?} ${cov:-cov: ?} corpus $corp; reproducer ${crash:-none}; see $log")
    grep -m 3 -E 'ERROR: |runtime error|SUMMARY' "$log" | sed 's/^/    /'
  else
    summary+=("$t: ok execs ${execs:-?} ${cov:-cov: ?} corpus $corp")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
