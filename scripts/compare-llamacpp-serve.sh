#!/usr/bin/env bash
# `tessera serve` beside llama.cpp's llama-server under the same closed-loop load: the same GGUF,
# thread count and seeded request mix (bench/serve_load.py), one server at a time (never both at
# once: they would share the cores). For each client count C it starts
#   llama-server -m GGUF -t THREADS -np C -c (CTX_PER_SLOT x C) --host 127.0.0.1 --port P
#   tessera serve -m GGUF --threads THREADS --max-batch C --host 127.0.0.1 --port Q
# in turn, waits for GET /health, runs serve_load.py --clients C against it, stops it, and at the
# end prints tessera/llama.cpp ratios of output tokens/s, TTFT and ITL per client count.
# llama-server is built by scripts/build-llamacpp.sh from the llama.cpp tree vendored in the
# llama-cpp-python source package on PyPI: a yardstick, never a dependency of Tessera.
#
#   scripts/compare-llamacpp-serve.sh [flags] [-- serve_load.py flags]
#     -m, --model GGUF        (models/SmolLM2-135M-Instruct.Q4_1.gguf)
#     --clients LIST          client counts, one server start each (1,8,32,64)
#     --threads N             threads of both servers (2)
#     --requests N            per level, at most (200)
#     --seconds S             per level: no request starts later (120)
#     --ctx-per-slot N        llama-server context per slot (2048; raised to fit --long-prompt-tokens)
#     --kv-memory SIZE        tessera serve --kv-memory (unset: its default)
#     --seed N                the request mix (1)
#     --only llama|tessera    run one side only (no ratios)
#     --llama-port P, --tessera-port Q   (28180, 28181)
#     --tessera PATH          (build/tessera)
#     --out DIR               (docs/compare/serve-<UTC date>)
#   Everything after -- goes to serve_load.py for both servers (e.g. --prompt-tokens 100-1000
#   --output-tokens 50-300 --prefix-tokens 800 --long-prompt-at 20 --long-prompt-tokens 4000).
# Writes machine.txt, <server>-c<C>.json (serve_load.py reports), <server>-c<C>.log (server
# output) and ratios.md to DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

model=models/SmolLM2-135M-Instruct.Q4_1.gguf
clients=1,8,32,64
threads=2
requests=200
seconds=120
ctx_per_slot=
kv_memory=
seed=1
only=
llama_port=28180
tessera_port=28181
tessera=build/tessera
out=docs/compare/serve-$(date -u +%Y-%m-%d)
load_args=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    -m|--model) model=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --ctx-per-slot) ctx_per_slot=$2; shift 2 ;;
    --kv-memory) kv_memory=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --llama-port) llama_port=$2; shift 2 ;;
    --tessera-port) tessera_port=$2; shift 2 ;;
    --tessera) tessera=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; load_args=("$@"); break ;;
    *) echo "compare-llamacpp-serve: unknown flag $1 (--help)" >&2; exit 2 ;;
  esac
done
[[ $clients =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "compare-llamacpp-serve: bad --clients $clients" >&2; exit 2; }
[[ -z $only || $only == llama || $only == tessera ]] || { echo "compare-llamacpp-serve: --only llama|tessera" >&2; exit 2; }
[[ -f $model ]] || { echo "compare-llamacpp-serve: no file $model" >&2; exit 1; }
if [[ $only != llama ]]; then
  [[ -x $tessera ]] || { echo "compare-llamacpp-serve: $tessera not built (make build)" >&2; exit 1; }
  "$tessera" serve --help > /dev/null 2>&1 || { echo "compare-llamacpp-serve: $tessera has no serve command" >&2; exit 1; }
fi
# llama-server splits -c evenly over its -np slots: each slot must hold the longest request.
long_tokens=0
for ((i = 0; i < ${#load_args[@]}; i++)); do
  case ${load_args[i]} in
    --long-prompt-at) ((long_tokens > 0)) || long_tokens=4000 ;;
    --long-prompt-tokens) long_tokens=${load_args[i+1]:-4000} ;;
    --long-prompt-tokens=*) long_tokens=${load_args[i]#*=} ;;
  esac
done
if [[ -z $ctx_per_slot ]]; then
  ctx_per_slot=2048
  ((long_tokens + 512 <= ctx_per_slot)) || ctx_per_slot=$(( (long_tokens + 512 + 255) / 256 * 256 ))
fi

server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2> /dev/null; then
    kill -TERM "$server_pid" 2> /dev/null || true
    for _ in $(seq 1 50); do kill -0 "$server_pid" 2> /dev/null || break; sleep 0.2; done
    kill -KILL "$server_pid" 2> /dev/null || true
    wait "$server_pid" 2> /dev/null || true
  fi
  server_pid=
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_free() { ! (exec 3<> "/dev/tcp/127.0.0.1/$1") 2> /dev/null; }
# Starts "$@" in the background with its output in $log; waits (bounded) for GET /health = 200.
start_server() {
  local port=$1 log=$2; shift 2
  port_free "$port" || { echo "compare-llamacpp-serve: port $port is taken" >&2; exit 1; }
  "$@" > "$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 600); do
    kill -0 "$server_pid" 2> /dev/null || { echo "compare-llamacpp-serve: server died, see $log:" >&2; tail -5 "$log" >&2; server_pid=; exit 1; }
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") == 200 ]] && return 0
    sleep 0.2
  done
  echo "compare-llamacpp-serve: no /health 200 from port $port in 120 s, see $log" >&2
  exit 1
}

run_load() {  # name port clients
  local name=$1 port=$2 c=$3
  echo "== $name, $c clients" >&2
  python3 bench/serve_load.py --url "http://127.0.0.1:$port" --clients "$c" --requests "$requests" \
    --seconds "$seconds" --seed "$seed" --server-pid "$server_pid" "${load_args[@]}" --json \
    > "$out/$name-c$c.json" || echo "compare-llamacpp-serve: serve_load.py exited $? against $name" >&2
}

mkdir -p "$out"
llama=
[[ $only == tessera ]] || llama=$(scripts/build-llamacpp.sh llama-server)
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
  echo "cpu_flags: $(grep -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "tessera_commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src 2> /dev/null || echo ' (+ uncommitted changes)')"
  echo "llamacpp: llama-cpp-python ${LLAMACPP_PYPI_VERSION:-0.3.36} source package, llama-server built by scripts/build-llamacpp.sh $([[ ${LLAMACPP_AMX:-0} == 1 ]] && echo with || echo without) AMX"
  echo "model: $model"
  echo "command: scripts/compare-llamacpp-serve.sh -m $model --clients $clients --threads $threads --requests $requests --seconds $seconds --ctx-per-slot $ctx_per_slot${kv_memory:+ --kv-memory $kv_memory} --seed $seed${only:+ --only $only} -- ${load_args[*]}"
} > "$out/machine.txt"

IFS=, read -r -a levels <<< "$clients"
for c in "${levels[@]}"; do
  if [[ $only != tessera ]]; then
    start_server "$llama_port" "$out/llama-c$c.log" "$llama" -m "$model" -t "$threads" -np "$c" \
      -c $((ctx_per_slot * c)) --host 127.0.0.1 --port "$llama_port" --metrics
    run_load llama "$llama_port" "$c"
    cleanup
  fi
  if [[ $only != llama ]]; then
    start_server "$tessera_port" "$out/tessera-c$c.log" "$tessera" serve -m "$model" --threads "$threads" \
      --max-batch "$c" ${kv_memory:+--kv-memory "$kv_memory"} --host 127.0.0.1 --port "$tessera_port"
    run_load tessera "$tessera_port" "$c"
    cleanup
  fi
done

python3 - "$out" "$clients" "$only" << 'EOF' | tee "$out/ratios.md"
import json, os, sys
out, clients, only = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], sys.argv[3]
def level(name, c):
    try:
        with open(os.path.join(out, f"{name}-c{c}.json")) as f:
            return json.load(f)["levels"][0]
    except (OSError, ValueError, IndexError, KeyError):
        return None
def g(lv, *path):
    for p in path:
        lv = None if lv is None else lv.get(p)
    return lv
def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"
def f(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"
sides = [s for s in ("tessera", "llama") if only in ("", s)]
print("| server | clients | ok | failed | out tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for c in clients:
    for s in sides:
        lv = level(s, c)
        if lv is None:
            print(f"| {s} | {c} | no result | | | | | | |")
            continue
        print(f"| {s} | {c} | {lv['ok']} | {lv['failed'] + lv['aborted']} | {f(lv['output_tokens_per_s'])} | "
              f"{f(g(lv, 'ttft_ms', 'p50'))} | {f(g(lv, 'ttft_ms', 'p99'))} | {f(g(lv, 'itl_ms', 'p50'))} | "
              f"{f(g(lv, 'itl_ms', 'p99'))} |")
if not only:
    print()
    print("tessera / llama.cpp (tok/s above 1: tessera faster; TTFT and ITL below 1: tessera quicker)")
    print()
    print("| clients | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 |")
    print("|---|---|---|---|---|---|")
    for c in clients:
        t, l = level("tessera", c), level("llama", c)
        print(f"| {c} | {ratio(g(t, 'output_tokens_per_s'), g(l, 'output_tokens_per_s'))} | "
              f"{ratio(g(t, 'ttft_ms', 'p50'), g(l, 'ttft_ms', 'p50'))} | "
              f"{ratio(g(t, 'ttft_ms', 'p99'), g(l, 'ttft_ms', 'p99'))} | "
              f"{ratio(g(t, 'itl_ms', 'p50'), g(l, 'itl_ms', 'p50'))} | "
              f"{ratio(g(t, 'itl_ms', 'p99'), g(l, 'itl_ms', 'p99'))} |")
EOF
