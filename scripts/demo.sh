#!/usr/bin/env bash
# The main job (`make run`): (1) run the default model (SmolLM2-135M-Instruct, fetched by
# scripts/install-deps.sh) on a fixed chat prompt, printing its answer and speed, and measure
# where decode sits on the memory roofline, then serve it (tessera serve on loopback: eight
# concurrent requests through the OpenAI API, then the server's metrics); (2) train a byte-level
# BPE tokenizer and a small GPT-2 on the fortunes corpus (quotations Debian's `fortunes` package
# installs), with samples before and after training and the loss curve written as SVG.
set -euo pipefail
tessera=${1:-build/tessera}
out=${DEMO_OUT:-runs/demo}
steps=${DEMO_STEPS:-600}
model=${DEMO_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p "$out"

echo "== chat with $model (greedy)"
"$tessera" generate -m "$model" -p "What is the capital of France, and what is it famous for?" \
  -n 96 --temperature 0
echo "== generation speed (tessera bench generate)"
"$tessera" bench generate -m "$model" --prompt 128 --gen 64 --reps 2 --batch 1,4,16

echo "== serving it: tessera serve on 127.0.0.1, eight concurrent chat requests"
port=${DEMO_PORT:-18931}
"$tessera" serve -m "$model" --port "$port" --kv-memory 256MiB --max-batch 8 \
  > "$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
python3 - "$port" "$(basename "$model" .gguf)" <<'PY'
import json, sys, threading, time, urllib.request
port, name = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
for _ in range(300):  # up to a minute for the model to load
    try:
        urllib.request.urlopen(base + "/health", timeout=2)
        break
    except OSError:
        time.sleep(0.2)
answers = {}
def ask(topic):
    body = {"model": name, "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": f"One sentence about {topic}."}]}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode())
    answers[topic] = json.load(urllib.request.urlopen(req, timeout=300))
topics = ["the sea", "bread", "chess", "owls", "rain", "tea", "maps", "snow"]
start = time.time()
threads = [threading.Thread(target=ask, args=(t,)) for t in topics]
for t in threads: t.start()
for t in threads: t.join()
for t in topics:
    print(f"  {t}: " + answers[t]["choices"][0]["message"]["content"].replace("\n", " ")[:90])
tokens = sum(a["usage"]["completion_tokens"] for a in answers.values())
metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode().splitlines()
value = lambda n: float(next(l.split()[-1] for l in metrics if l.startswith(n + " ")))
print(f"  {tokens} tokens in {time.time() - start:.1f} s; {value('tessera_engine_steps_total'):.0f} "
      f"engine steps, {value('tessera_step_sequences_sum') / value('tessera_step_sequences_count'):.1f} "
      "sequences per step on average")
PY
kill -TERM "$server"
wait "$server" || true
trap - EXIT

corpus="$out/corpus.txt"
if [ ! -s "$corpus" ]; then
  # Every fortune file (not the .dat indexes or .u8 links), with '%' lines separating entries.
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat > "$corpus"
fi
echo "== corpus: $(wc -c < "$corpus") bytes from /usr/share/games/fortunes"

echo "== machine peaks (tessera probe)"
"$tessera" probe

echo "== tokenizer"
[ -s "$out/tok.json" ] || "$tessera" tokenizer train --vocab 4096 --in "$corpus" --out "$out/tok.json"

echo "== token shards"
"$tessera" prepare --tokenizer "$out/tok.json" --in "$corpus" --out "$out/data" --val-fraction 0.02

rm -rf "$out/run"
echo "== sample before training (random weights)"
# --steps 0 writes the initialized model and the run's options; the resume below trains it.
"$tessera" train --model gpt2-tiny --data "$out/data" --batch 16 --seq 128 --steps 0 \
  --lr 2e-3 --warmup 50 --schedule cosine --eval-every 100 --early-stop 5 \
  --checkpoint-every 200 --threads 0 --out "$out/run" > /dev/null
"$tessera" sample --ckpt "$out/run" --prompt "The meaning of life is" --max-tokens 40 \
  --temperature 0.8 --seed 1
echo

echo "== training gpt2-tiny for $steps steps"
"$tessera" train --resume "$out/run" --steps "$steps"

echo "== sample after training"
"$tessera" sample --ckpt "$out/run" --prompt "The meaning of life is" --max-tokens 60 \
  --temperature 0.8 --seed 1
echo
echo "== loss curve: $out/run/loss.svg, log: $out/run/train.csv"
