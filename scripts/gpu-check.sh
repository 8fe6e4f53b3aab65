#!/usr/bin/env bash
# Runs ON the device machine (NVIDIA H200, nvcc, CMake, ninja, no network): unpacks the .deb
# packages carried in .gpu-deps/ (made by scripts/gpu-prepare.sh) into a prefix under /tmp,
# configures a Release build for sm_90a, builds the CUDA tests, benches and the tessera binary,
# runs every test binary, then every bench (all of them, whatever fails), the yardsticks (cuDNN
# and PyTorch attention and torch.matmul through the image's PyTorch,
# bench/cuda/torch_yardstick.py), then `tessera bench generate --device cuda` on synthetic
# 1B/8B Llamas and `tessera bench train --device cuda` on GPT-2 small, and writes logs and a
# summary to $OUT. The CLI tests (tests/cli: the ones `ctest` runs there) run after the CUDA tests:
# with a GPU, `generate --device cuda` must produce text; their InferCli tests need
# models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, more than a device run carries) in the tree.
# (./gpu-out when OUT is unset). Stages are bounded so the whole run ends within ~8 minutes.
#
# Usage: scripts/gpu-check.sh [--dry-run]
#   --dry-run   unpack and configure only (checks the script's non-GPU parts anywhere)
# Environment: OUT, GPU_CHECK_BUILD (build dir, default /tmp/tessera-gpu-build),
#   GPU_CHECK_ARCH (default 90a), GPU_CHECK_JOBS (default 16), GPU_CHECK_BUDGET_S (default 470),
#   GPU_CHECK_ONLY (extended regex: build and run only matching test/bench targets),
#   GPU_CHECK_REUSE_BUILD=1 (configure the existing build dir in place instead of wiping it).
# Output files (at most 8, the device tool's limit): summary.txt, configure.log, build.log,
#   tests.log, bench.jsonl, bench.log.
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/gpu-out}"
build="${GPU_CHECK_BUILD:-/tmp/tessera-gpu-build}"
arch="${GPU_CHECK_ARCH:-90a}"
jobs="${GPU_CHECK_JOBS:-16}"
budget="${GPU_CHECK_BUDGET_S:-470}"
prefix=/tmp/tessera-gpu-deps
dry_run=0
[[ "${1:-}" == "--dry-run" ]] && dry_run=1

mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
t0=$(date +%s)
log() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - t0)); }
# Seconds a stage may take: its own cap, but never past the overall budget (keeping `reserve`
# seconds for what must follow).
stage_limit() {
  local cap=$1 reserve=${2:-0} left
  left=$((budget - $(elapsed) - reserve))
  ((left < 5)) && left=5
  ((cap < left)) && echo "$cap" || echo "$left"
}
# Whether a measuring stage may start at all: one given a few seconds would only time out, and
# many such stages would run past the budget.
can_start() { ((budget - $(elapsed) >= 15)); }

log "== tessera gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
nvcc_bin="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
log "nvcc:    $("$nvcc_bin" --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo missing)"
log "cmake:   $(cmake --version 2>/dev/null | head -1 || echo missing)"
log "ninja:   $(ninja --version 2>/dev/null || echo missing)"
log "c++:     $(c++ --version 2>/dev/null | head -1 || echo missing)"
if command -v nvidia-smi >/dev/null; then
  log "gpu:     $(timeout -k 2 10 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>&1 | head -4)"
else
  log "gpu:     nvidia-smi not found"
fi

# ---- unpack the carried packages (never into /) ----
debs=("$root"/.gpu-deps/*.deb)
if [[ ! -e "${debs[0]}" ]]; then
  log "FATAL: no packages in $root/.gpu-deps (run scripts/gpu-prepare.sh where apt works, and carry .gpu-deps)"
  exit 2
fi
if ! command -v dpkg >/dev/null; then
  log "FATAL: dpkg not found; cannot unpack .gpu-deps"
  exit 2
fi
rm -rf "$prefix"
mkdir -p "$prefix"
for f in "${debs[@]}"; do dpkg -x "$f" "$prefix" || log "WARN: dpkg -x failed for $f"; done
libdir="$prefix/usr/lib/x86_64-linux-gnu"
export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"
export LIBRARY_PATH="$libdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "deps:    ${#debs[@]} packages unpacked into $prefix ($(elapsed) s)"

# NCCL: from the CUDA toolkit if it has it, else from the nvidia-nccl Python wheel if installed.
nccl_args=()
if [[ ! -e /usr/local/cuda/include/nccl.h ]]; then
  nccl_root="$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
  if [[ -n "$nccl_root" && -e "$nccl_root/include/nccl.h" ]]; then
    nccl_args=(-DTESSERA_NCCL_ROOT="$nccl_root")
    export LD_LIBRARY_PATH="$nccl_root/lib:$LD_LIBRARY_PATH"
  fi
fi
log "nccl:    ${nccl_args[*]:-toolkit default search}"

# ---- configure ----
[[ "${GPU_CHECK_REUSE_BUILD:-0}" == 1 ]] || rm -rf "$build"
limit=$(stage_limit 120 300)
timeout -k 5 "$limit" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc_bin" -DCMAKE_CUDA_ARCHITECTURES="$arch" -DTESSERA_CUDA=on \
  -DTESSERA_FUZZ=OFF -DTESSERA_BENCH=ON -DTESSERA_WERROR=OFF \
  -DCMAKE_PREFIX_PATH="$prefix/usr" "${nccl_args[@]}" >"$out/configure.log" 2>&1
rc=$?
log "configure: rc=$rc ($(elapsed) s)"
for dep in hwy_DIR GTest_DIR nlohmann_json_DIR benchmark_DIR TESSERA_NCCL_LIBRARY; do
  log "  $(grep -m1 "^$dep:" "$build/CMakeCache.txt" 2>/dev/null || echo "$dep: (not set)")"
done
if ((rc != 0)); then
  tail -30 "$out/configure.log" | tee -a "$summary"
  log "FATAL: configure failed"
  exit 1
fi

tests=()
for f in "$root"/tests/cuda/*_test.cc; do tests+=("cuda_$(basename "$f" .cc)"); done
cli_tests=()
for f in "$root"/tests/cli/*_test.cc; do cli_tests+=("cli_$(basename "$f" .cc)"); done
benches=()
for f in "$root"/bench/cuda/*_bench.cu; do
  [[ -e "$f" ]] && benches+=("tessera_cuda_$(basename "$f" .cu)")
done
if [[ -n "${GPU_CHECK_ONLY:-}" ]]; then
  mapfile -t tests < <(printf '%s\n' "${tests[@]}" | grep -E "$GPU_CHECK_ONLY")
  mapfile -t benches < <(printf '%s\n' "${benches[@]}" | grep -E "$GPU_CHECK_ONLY")
  mapfile -t cli_tests < <(printf '%s\n' "${cli_tests[@]}" | grep -E "$GPU_CHECK_ONLY")
fi
# The tessera binary runs the whole engine on the GPU (bench generate --device cuda below).
engine=(tessera)
if [[ -n "${GPU_CHECK_ONLY:-}" ]] && ! grep -qE "$GPU_CHECK_ONLY" <<<"tessera"; then engine=(); fi
log "targets: ${tests[*]} ${benches[*]} ${engine[*]} ${cli_tests[*]}"
if ((${#tests[@]} + ${#benches[@]} == 0)); then
  log "FATAL: no CUDA test or bench targets selected"
  exit 2
fi
if ((dry_run)); then
  log "dry run: stopping after configure ($(elapsed) s)"
  exit 0
fi

# ---- build (keep going past failures: one broken kernel must not hide the other results) ----
limit=$(stage_limit 330 90)
timeout -k 5 "$limit" ninja -C "$build" -k 0 -j "$jobs" "${tests[@]}" "${benches[@]}" "${engine[@]}" \
  "${cli_tests[@]}" >"$out/build.log" 2>&1
rc=$?
log "build: rc=$rc ($(elapsed) s, limit $limit s)"
if ((rc != 0)); then
  grep -E "error|FAILED" "$out/build.log" | head -20 | tee -a "$summary"
fi

# ---- tests ----
# Runs test binaries (names under $build/tests), appending to tests.log; adds to the totals
# t_pass, t_fail, t_skip and t_broken (binaries failing or missing). Each binary gets at most
# `cap` seconds, keeping `reserve` for what follows.
run_test_binaries() {
  local cap=$1 reserve=$2 t bin limit rc p f s status
  shift 2
  t_pass=0 t_fail=0 t_skip=0 t_broken=0
  for t in "$@"; do
    bin="$build/tests/$t"
    if [[ ! -x "$bin" ]]; then
      log "test $t: NOT BUILT"
      t_broken=$((t_broken + 1))
      continue
    fi
    limit=$(stage_limit "$cap" "$reserve")
    echo "===== $t" >>"$out/tests.log"
    # Full gtest output (not --gtest_brief: brief mode prints neither the failed-test count nor
    # the RUN lines that name the test a timeout or a crash stopped in).
    timeout -k 5 "$limit" "$bin" --gtest_color=no >"$out/.test_one.log" 2>&1
    rc=$?
    cat "$out/.test_one.log" >>"$out/tests.log"
    # One number each (tail -1: a stray second summary line must not break the arithmetic).
    p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/.test_one.log" | grep -oE '[0-9]+$' | tail -1)
    f=$(grep -oE '^\[  FAILED  \] [0-9]+ tests?,' "$out/.test_one.log" | grep -oE '[0-9]+' | tail -1)
    s=$(grep -oE '^\[  SKIPPED \] [0-9]+' "$out/.test_one.log" | grep -oE '[0-9]+$' | tail -1)
    [[ "$p" =~ ^[0-9]+$ ]] || p=0
    [[ "$f" =~ ^[0-9]+$ ]] || f=0
    [[ "$s" =~ ^[0-9]+$ ]] || s=0
    t_pass=$((t_pass + p)) t_fail=$((t_fail + f)) t_skip=$((t_skip + s))
    status=ok
    ((rc == 124)) && status="TIMEOUT after $limit s"
    ((rc != 0 && rc != 124)) && status="FAILED rc=$rc"
    ((rc != 0)) && t_broken=$((t_broken + 1))
    log "test $t: $status, passed $p, failed $f, skipped $s ($(elapsed) s)"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$out/.test_one.log" | sed 's/ ([0-9]* ms)$//' | sort -u |
      head -20 | tee -a "$summary"
    if ((rc != 0)); then
      log "  last test started: $(grep -E '^\[ RUN      \]' "$out/.test_one.log" | tail -1)"
    fi
  done
  rm -f "$out/.test_one.log"
}

: >"$out/tests.log"
run_test_binaries 120 60 "${tests[@]}"
pass=$t_pass fail=$t_fail skip=$t_skip broken=$t_broken
log "tests: passed $pass, failed $fail, skipped $skip, binaries failing/missing $broken"

# The CLI tests run the tessera binary (InferCli.DeviceCuda generates on the GPU); their model is
# not carried by a device run, so say whether it is there before they fail for the lack of it.
if ((${#cli_tests[@]})); then
  cli_model="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  [[ -f "$cli_model" ]] || log "cli tests: $cli_model missing: the InferCli tests will fail"
  run_test_binaries 120 60 "${cli_tests[@]}"
  log "cli tests: passed $t_pass, failed $t_fail, skipped $t_skip, binaries failing/missing $t_broken"
  fail=$((fail + t_fail)) broken=$((broken + t_broken))
fi

# ---- benches first (each issue target has one; each takes seconds), then the yardsticks, then
# the whole engine and trainer; a stage starts only with 15 s of budget left ----
: >"$out/bench.jsonl"
: >"$out/bench.log"
for b in "${benches[@]}"; do
  bin="$build/bench/$b"
  if [[ ! -x "$bin" ]]; then
    log "bench $b: NOT BUILT"
    continue
  fi
  if ! can_start; then
    log "bench $b: skipped, budget spent ($(elapsed) s)"
    continue
  fi
  limit=$(stage_limit 90 120)  # keeps time for the yardsticks and the engine runs below
  echo "===== $b" >>"$out/bench.log"
  timeout -k 5 "$limit" "$bin" >"$out/.bench_one.out" 2>>"$out/bench.log"
  rc=$?
  cat "$out/.bench_one.out" >>"$out/bench.log"
  grep '^{' "$out/.bench_one.out" >>"$out/bench.jsonl"
  log "bench $b: rc=$rc ($(elapsed) s)"
done
rm -f "$out/.bench_one.out"

# Yardsticks in the same run: cuDNN's fused attention, PyTorch's FlashAttention and torch.matmul
# (the image's PyTorch).
if can_start; then
  limit=$(stage_limit 60 90)
  echo "===== torch_yardstick.py" >>"$out/bench.log"
  timeout -k 5 "$limit" python3 "$root/bench/cuda/torch_yardstick.py" >"$out/.yard.out" \
    2>>"$out/bench.log"
  rc=$?
  cat "$out/.yard.out" >>"$out/bench.log"
  grep '^{' "$out/.yard.out" >>"$out/bench.jsonl"
  rm -f "$out/.yard.out"
  log "yardsticks: rc=$rc ($(elapsed) s)"
else
  log "yardsticks: skipped, budget spent ($(elapsed) s)"
fi

# tessera on the GPU: generation of synthetic Llama shapes, GPT-2 small training.
if ((${#engine[@]})) && [[ -x "$build/tessera" ]]; then
  # Each line: a name, extra environment, the tessera command, in the order of what the issue's
  # targets need most: 1b decode, the GPT-2 small training step (MFU), 8b decode; then the rest.
  # Every run is the one route: the model's own code on the CUDA ops backend (the bench prints
  # each decode stage's share from a pass whose ops are waited for one by one).
  # The 1b q4_0 decode repeats without programmatic dependent launch (each kernel waits for the
  # one before to end) and without CUDA graphs (every launch eager) to show what each saves;
  # the last line is GPT-2 small under --recompute block (its device memory and its cost).
  # GPT-2 small also trains with the Hopper (wgmma) attention forward and backward, for the A/B;
  # an 8b 4k-token prompt runs with and without the prompt tiles (TESSERA_CUDA_PAGED_PREFILL).
  runs=("generate 1b q4_0||bench generate -m synthetic:1b:q4_0 --prompt 512 --gen 128 --reps 3 --batch 1,8,64"
        "train gpt2-small||bench train --model gpt2-small --batch 16 --seq 1024 --precision bf16 --steps 5"
        "train gpt2-small wgmma|TESSERA_CUDA_FLASH_FWD=wgmma TESSERA_CUDA_FLASH_BWD=wgmma|bench train --model gpt2-small --batch 16 --seq 1024 --precision bf16 --steps 5"
        "generate 8b q4_0||bench generate -m synthetic:8b:q4_0 --prompt 512 --gen 64 --reps 2 --batch 1,8"
        "generate 1b q8_0||bench generate -m synthetic:1b:q8_0 --prompt 512 --gen 128 --reps 3 --batch 1,8"
        "generate 8b q8_0||bench generate -m synthetic:8b:q8_0 --prompt 512 --gen 64 --reps 2 --batch 1"
        "prefill 8b q4_0 4k||bench generate -m synthetic:8b:q4_0 --prompt 4096 --gen 8 --reps 2 --batch 1"
        "prefill 8b q4_0 4k no tiles|TESSERA_CUDA_PAGED_PREFILL=0|bench generate -m synthetic:8b:q4_0 --prompt 4096 --gen 8 --reps 2 --batch 1"
        "generate 1b q4_0 no PDL|TESSERA_CUDA_PDL=0|bench generate -m synthetic:1b:q4_0 --prompt 512 --gen 64 --reps 2 --batch 1"
        "generate 1b q4_0 no graphs|TESSERA_CUDA_GRAPHS=0|bench generate -m synthetic:1b:q4_0 --prompt 512 --gen 64 --reps 2 --batch 1"
        "train gpt2-small recompute block||bench train --model gpt2-small --batch 16 --seq 1024 --precision bf16 --recompute block --steps 3")
  for r in "${runs[@]}"; do
    IFS='|' read -r name envs cmd <<<"$r"
    if ! can_start; then
      log "tessera $name: skipped, budget spent ($(elapsed) s)"
      continue
    fi
    limit=$(stage_limit 75 0)
    echo "===== tessera $cmd ($envs)" >>"$out/bench.log"
    # shellcheck disable=SC2086
    env $envs timeout -k 5 "$limit" "$build/tessera" $cmd --device cuda --json \
      >"$out/.engine.out" 2>>"$out/bench.log"
    rc=$?
    cat "$out/.engine.out" >>"$out/bench.log"
    grep '^{' "$out/.engine.out" | sed "s/^{/{\"name\": \"$name\", /" >>"$out/bench.jsonl"
    log "tessera $name: rc=$rc ($(elapsed) s)"
  done
  rm -f "$out/.engine.out"
else
  log "engine: tessera NOT BUILT (or not selected)"
fi

# Tessera's figures against the yardsticks, the issue's targets, then every figure.
timeout -k 2 20 python3 "$root/bench/cuda/torch_yardstick.py" --compare "$out/bench.jsonl" |
  tee -a "$summary"
timeout -k 2 20 python3 "$root/bench/cuda/targets.py" "$out/bench.jsonl" | tee -a "$summary"
log "bench results (bench.jsonl):"
cat "$out/bench.jsonl" | tee -a "$summary" >/dev/null
cat "$out/bench.jsonl"
log "== done in $(elapsed) s"
((fail == 0 && broken == 0))
