#!/usr/bin/env python3
"""Closed-loop load generator for OpenAI-compatible streaming chat servers.

Drives `tessera serve` (or llama-server, or any server that speaks the OpenAI chat API) with
closed-loop clients: each client sends one streaming /v1/chat/completions request, reads the
stream to its end, and sends the next. Python 3 standard library only (threads + http.client).

The request mix is fixed by --seed and the level's client count: request i of the C-client level
has the same prompt and output length in every run, against any server, so two servers see the
same work; levels of one run differ, so that no level hits prompts an earlier one left in the
server's prefix cache.
Prompts are seeded pseudo-random sentences of common English words (about one token per word
and per full stop in a BPE vocabulary; the table shows the prompt tokens the server counted).
The output length is forced with max_tokens plus ignore_eos (an extension that tessera serve,
vLLM and llama-server accept); `short` counts replies that came back with fewer tokens.

Per level of --clients it reports: output tokens/s (usage.completion_tokens of the requests that
succeeded, or their content chunks where a server sends no usage, over the level's wall time),
requests/s, time to first token p50/p99 (send to first non-empty content chunk), inter-token
latency p50/p99 (gaps between consecutive content chunks of one stream), time per output token,
requests ok/failed/aborted, the time of new TCP connects (apart from TTFT) and the 1-minute load
average before and after the level (this machine's, server included). Every level is bounded by
--requests and --seconds: no new request starts after --seconds, and requests still streaming
--drain-seconds later are cut (aborted).

  bench/serve_load.py --url http://127.0.0.1:8080 --clients 1,8,32,64 --requests 200 --seconds 120
  bench/serve_load.py --url ... --prefix-tokens 800            # shared system prompt (prefix cache)
  bench/serve_load.py --url ... --clients 16 --long-prompt-at 10 --long-prompt-tokens 4000
  bench/serve_load.py --url ... --soak --server-pid PID         # 64 clients, 600 s, RSS + KV leak
  bench/serve_load.py --self-test                              # statistics checked on a mock server

--json prints the report as one JSON line on stdout (the table then goes to stderr).
Exit status: 0, or 1 when a level had no successful request, or a soak saw failures or leaked KV
blocks, or the self-test failed; 2 for bad arguments.
"""

import argparse
import http.client
import http.server
import json
import math
import os
import random
import socket
import socketserver
import sys
import threading
import time
import urllib.parse

# Common English words, each usually one token (with its leading space) in a BPE vocabulary.
WORDS = """
the of and to in is was for on that with as by at from his it an were are which be this has
also or had its first new their one after two been who more other all time but they when
into most about during only can over some her years people would up made used out there many
world three city such while may where these state later under between several first would
part then both well year called them through since each four same because before most any
home back found work life known being small great against early river school game family place
still around high long house water group night number women good best name film book music king
road light power field great open young story money order point body early land short sound
side paper line river music week party table child voice south north east west level range
court green black white window garden summer winter morning evening letter market station
street village island mountain forest bridge church castle valley ocean desert harbor
train plane horse river stone metal glass wood cloud storm fire earth plant tree flower
seed fruit bread cheese apple table chair door floor wall roof kitchen bottle cup plate
simple quiet bright dark warm cold heavy light fast slow early late happy strong clear
walk run read write speak listen watch carry build break bring begin learn teach follow
""".split()


def percentile(sorted_values, q):
    """Linear-interpolation percentile (numpy's default) of an ascending list; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    k = (n - 1) * q / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def dist(values, scale=1.0):
    """p50/p90/p99/mean/max of a list (times scale), rounded; None fields when empty."""
    v = sorted(x * scale for x in values)
    r = lambda x: None if x is None else round(x, 3)
    return {
        "n": len(v),
        "p50": r(percentile(v, 50)),
        "p90": r(percentile(v, 90)),
        "p99": r(percentile(v, 99)),
        "mean": r(sum(v) / len(v)) if v else None,
        "max": r(v[-1]) if v else None,
    }


def make_text(rng, n_tokens):
    """Sentences of random common words: about n_tokens tokens (one per word and per stop)."""
    out = []
    count = 0
    while count < n_tokens:
        length = min(rng.randint(5, 15), max(1, n_tokens - count - 1))
        out.append(" ".join(rng.choice(WORDS) for _ in range(length)) + ".")
        count += length + 1
    return " ".join(out)


class Spec:
    """One request of the seeded mix."""

    __slots__ = ("index", "prompt_tokens", "max_tokens", "text")

    def __init__(self, index, prompt_tokens, max_tokens, text):
        self.index = index
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.text = text


class Mix:
    """The seeded request mix: spec(i) depends only on the seed, the salt, i and the length ranges.

    Each level salts the mix with its client count, so that a level meets no prompt that an
    earlier level of the same run left in the server's prefix cache, while two runs (or two
    servers) at the same client count still get the same requests."""

    def __init__(self, seed, prompt_range, output_range, prefix_tokens, salt=0):
        self.seed = seed
        self.salt = salt
        self.prompt_range = prompt_range
        self.output_range = output_range
        self.system = make_text(random.Random(f"prefix:{seed}"), prefix_tokens) if prefix_tokens else None

    def spec(self, i):
        rng = random.Random(f"request:{self.seed}:{self.salt}:{i}")
        p = rng.randint(*self.prompt_range)
        o = rng.randint(*self.output_range)
        return Spec(i, p, o, make_text(rng, p))

    def long_spec(self, tokens, max_tokens):
        return Spec(-1, tokens, max_tokens, make_text(random.Random(f"long:{self.seed}"), tokens))

    def salted(self, salt):
        m = Mix.__new__(Mix)
        m.__dict__.update(self.__dict__)
        m.salt = salt
        return m

    def messages(self, spec):
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        msgs.append({"role": "user", "content": spec.text})
        return msgs


class Endpoint:
    def __init__(self, url, api_key, timeout):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme != "http":
            raise ValueError(f"only http:// URLs are supported, got {url!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.base = u.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[:-3]
        self.api_key = api_key
        self.timeout = timeout

    def connection(self, timeout=None):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path, timeout=10.0):
        """(status, body bytes) of a GET; raises OSError/HTTPException on failure."""
        conn = self.connection(timeout)
        try:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            conn.request("GET", self.base + path, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


def parse_metrics(text):
    """Prometheus text format to {name: value summed over label sets}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            rest = line[line.rfind("}") + 1:].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def read_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Result:
    __slots__ = ("index", "ok", "aborted", "error", "t_send", "t_first", "t_end", "chunk_times",
                 "completion_tokens", "prompt_tokens", "cached_tokens", "max_tokens", "usage_seen",
                 "status", "target_prompt", "connect_s")

    def __init__(self, index, max_tokens, target_prompt=None):
        self.index = index
        self.target_prompt = target_prompt
        self.ok = False
        self.aborted = False
        self.error = None
        self.t_send = None
        self.t_first = None
        self.t_end = None
        self.chunk_times = []
        self.completion_tokens = None
        self.prompt_tokens = None
        self.cached_tokens = None
        self.max_tokens = max_tokens
        self.usage_seen = False
        self.status = None
        self.connect_s = None

    @property
    def tokens(self):
        return self.completion_tokens if self.completion_tokens is not None else len(self.chunk_times)


def error_message(body):
    text = body[:2000].decode("utf-8", "replace")
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except (ValueError, AttributeError):
        pass
    return text.strip()[:200]


def stream_chat(conn, endpoint, body, res):
    """Sends one streaming chat request on conn and fills res; raises on transport errors.
    A new TCP connection is opened first and timed apart (connect_s): TTFT starts at the send."""
    if conn.sock is None:
        t = time.perf_counter()
        conn.connect()
        res.connect_s = time.perf_counter() - t
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    res.t_send = time.perf_counter()
    conn.request("POST", endpoint.base + "/v1/chat/completions", body=body, headers=headers)
    resp = conn.getresponse()
    res.status = resp.status
    if resp.status != 200:
        msg = error_message(resp.read())
        res.t_end = time.perf_counter()
        res.error = f"HTTP {resp.status}: {msg[:160]}"
        return
    data_lines = []
    done = False
    times = res.chunk_times
    while True:
        line = resp.readline()
        if not line:
            break
        now = time.perf_counter()
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data:"):
            data_lines.append(line[5:].lstrip(b" "))
            continue
        if line or not data_lines:
            continue  # comments (":"), "event:"/"id:" fields, stray blank lines
        data = b"\n".join(data_lines)
        data_lines = []
        if data == b"[DONE]":
            done = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            res.error = f"bad SSE data: {data[:80]!r}"
            break
        if not isinstance(event, dict):
            continue
        if event.get("error"):
            err = event["error"]
            res.error = "stream error: " + str(err.get("message", err) if isinstance(err, dict) else err)[:160]
            break
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                if res.t_first is None:
                    res.t_first = now
                times.append(now)
        usage = event.get("usage")
        if usage:
            res.usage_seen = True
            res.completion_tokens = usage.get("completion_tokens")
            res.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            res.cached_tokens = details.get("cached_tokens")
    res.t_end = time.perf_counter()
    if res.error is None:
        if not done:
            res.error = "stream ended without [DONE]"
        elif not times:
            res.error = "no content chunk"
        else:
            res.ok = True
    if done:
        # Read the end of the chunked body so that the connection can carry the next request.
        sock = conn.sock
        try:
            if sock is not None:
                sock.settimeout(5.0)
            resp.read()
            if sock is not None and conn.sock is sock:
                sock.settimeout(endpoint.timeout)
        except (OSError, http.client.HTTPException):
            conn.close()
    else:
        resp.close()
        conn.close()


def request_body(model, mix, spec, args):
    body = {
        "model": model,
        "messages": mix.messages(spec),
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,
        "temperature": args.temperature,
    }
    if args.temperature > 0:
        body["seed"] = args.seed * 1000003 + max(spec.index, 0)
    return json.dumps(body).encode()


class Level:
    """One closed-loop run: `clients` threads sharing a request counter and a deadline."""

    def __init__(self, args, endpoint, mix, model, clients, n_requests, seconds):
        self.args = args
        self.endpoint = endpoint
        self.mix = mix
        self.model = model
        self.clients = clients
        self.n_requests = n_requests
        self.seconds = seconds
        self.lock = threading.Lock()
        self.next = 0
        self.results = []
        self.conns = {}
        self.abort = False
        self.stop = threading.Event()
        self.long = None
        self.samples = []

    def take(self):
        with self.lock:
            if self.abort or self.next >= self.n_requests or time.perf_counter() >= self.deadline:
                return None
            i = self.next
            self.next += 1
            return i

    def one(self, key, spec):
        res = Result(spec.index, spec.max_tokens, spec.prompt_tokens)
        body = request_body(self.model, self.mix, spec, self.args)
        conn = self.conns.get(key)
        reused = conn is not None
        if conn is None:
            conn = self.endpoint.connection()
            with self.lock:
                self.conns[key] = conn
        try:
            try:
                stream_chat(conn, self.endpoint, body, res)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the server had closed meanwhile: once more on a new one.
                if not reused or res.status is not None or self.abort:
                    raise
                conn.close()
                res.t_send = None
                stream_chat(conn, self.endpoint, body, res)
        except (OSError, http.client.HTTPException, ValueError) as e:
            res.t_end = time.perf_counter()
            res.ok = False
            res.aborted = self.abort
            res.error = f"{type(e).__name__}: {e}"[:160] or type(e).__name__
            conn.close()
            with self.lock:
                self.conns.pop(key, None)
        if not res.ok and self.abort:
            res.aborted = True
        if res.aborted:
            res.error = "aborted at the drain deadline"
        return res

    def client(self, cid):
        while True:
            i = self.take()
            if i is None:
                break
            res = self.one(cid, self.mix.spec(i))
            with self.lock:
                self.results.append(res)
            if not res.ok and not self.abort:
                time.sleep(0.1)  # no busy loop against a server that refuses at once
        conn = self.conns.pop(cid, None)
        if conn is not None:
            conn.close()

    def long_request(self):
        at = self.start + self.args.long_prompt_at
        while time.perf_counter() < at:
            if self.stop.wait(min(0.05, max(0.0, at - time.perf_counter()))):
                return
        spec = self.mix.long_spec(self.args.long_prompt_tokens, self.args.long_prompt_output)
        self.long = self.one("long", spec)

    def sampler(self):
        every = self.args.sample_every
        t_next = self.start
        while True:
            self.samples.append(sample(self.args, self.endpoint, time.perf_counter() - self.start))
            t_next += every
            if self.stop.wait(max(0.0, t_next - time.perf_counter())):
                return

    def run(self):
        self.start = time.perf_counter()
        self.deadline = self.start + self.seconds
        threads = [threading.Thread(target=self.client, args=(c,), daemon=True) for c in range(self.clients)]
        extra = []
        if self.args.long_prompt_at is not None and self.args.long_prompt_at < self.seconds:
            extra.append(threading.Thread(target=self.long_request, daemon=True))
        if self.args.soak:
            extra.append(threading.Thread(target=self.sampler, daemon=True))
        for t in threads + extra:
            t.start()
        hard = self.deadline + self.args.drain_seconds
        for t in threads:
            t.join(max(0.0, hard - time.perf_counter()))
        if any(t.is_alive() for t in threads):
            with self.lock:
                self.abort = True
                conns = list(self.conns.values())
            for c in conns:
                try:
                    if c.sock is not None:
                        c.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            for t in threads:
                t.join(5.0)
        self.wall = time.perf_counter() - self.start
        self.stop.set()
        for t in extra:
            t.join(max(1.0, hard + 5.0 - time.perf_counter()))
        return self.summary()

    def summary(self):
        with self.lock:
            results = list(self.results)
        ok = [r for r in results if r.ok]
        aborted = [r for r in results if r.aborted]
        failed = [r for r in results if not r.ok and not r.aborted]
        ttft = [r.t_first - r.t_send for r in ok]
        itl = []
        tpot = []
        for r in ok:
            ts = r.chunk_times
            itl.extend(b - a for a, b in zip(ts, ts[1:]))
            if r.tokens > 1:
                tpot.append((ts[-1] - ts[0]) / (r.tokens - 1))
        out_tokens = sum(r.tokens for r in ok)
        errors = {}
        for r in failed + aborted:
            errors[r.error] = errors.get(r.error, 0) + 1
        connects = [r.connect_s for r in results if r.connect_s is not None]
        prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
        cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
        wall = self.wall
        s = {
            "clients": self.clients,
            "requests": len(results),
            "ok": len(ok),
            "failed": len(failed),
            "aborted": len(aborted),
            "short": sum(1 for r in ok if r.tokens < r.max_tokens),
            "usage_missing": sum(1 for r in ok if not r.usage_seen),
            "duration_s": round(wall, 3),
            "output_tokens": out_tokens,
            "output_tokens_per_s": round(out_tokens / wall, 2) if wall > 0 else None,
            "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
            "ttft_ms": dist(ttft, 1000.0),
            "itl_ms": dist(itl, 1000.0),
            "tpot_ms": dist(tpot, 1000.0),
            "connect_ms": dist(connects, 1000.0),
            "prompt_tokens_mean": round(sum(prompt) / len(prompt), 1) if prompt else None,
            "requested_prompt_tokens_mean": round(sum(r.target_prompt for r in ok) / len(ok), 1) if ok else None,
            "cached_tokens_mean": round(sum(cached) / len(cached), 1) if cached else None,
            "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5]),
        }
        if self.args.long_prompt_at is not None:
            s["long_prompt"] = self.long_summary(ok)
        if self.args.soak:
            s["samples"] = self.samples
        return s

    def long_summary(self, ok):
        lr = self.long
        if lr is None:
            return {"sent": False, "note": "level ended before --long-prompt-at"}
        out = {
            "sent": True,
            "ok": lr.ok,
            "error": lr.error,
            "prompt_tokens": lr.prompt_tokens,
            "at_s": round(lr.t_send - self.start, 3),
            "ttft_ms": round((lr.t_first - lr.t_send) * 1000, 3) if lr.t_first else None,
        }
        # The window: from sending the long prompt to its first token (its prefill), or to its end.
        w0 = lr.t_send
        w1 = lr.t_first or lr.t_end or w0
        during, outside = [], []
        streams = 0
        for r in ok:
            ts = r.chunk_times
            if ts and ts[0] < w1 and ts[-1] > w0:
                streams += 1
            for a, b in zip(ts, ts[1:]):
                (during if (b > w0 and a < w1) else outside).append(b - a)
        out["window_ms"] = round((w1 - w0) * 1000, 3)
        out["streams_during"] = streams
        out["itl_during_ms"] = dist(during, 1000.0)
        out["itl_outside_ms"] = dist(outside, 1000.0)
        d, o = out["itl_during_ms"], out["itl_outside_ms"]
        out["p99_over_median_itl"] = (round(d["p99"] / o["p50"], 2) if d["p99"] is not None and o["p50"] else None)
        return out


def sample(args, endpoint, t):
    s = {"t_s": round(t, 1)}
    if args.server_pid:
        s["rss_kib"] = read_rss_kib(args.server_pid)
    try:
        status, body = endpoint.get("/metrics", timeout=5.0)
        if status == 200:
            m = parse_metrics(body.decode("utf-8", "replace"))
            for name in ("tessera_kv_blocks_used", "tessera_kv_blocks_free", "tessera_requests_running",
                         "tessera_requests_waiting"):
                if name in m:
                    s[name[len("tessera_"):]] = m[name]
        else:
            s["metrics_status"] = status
    except (OSError, http.client.HTTPException) as e:
        s["metrics_error"] = type(e).__name__
    return s


def soak_report(args, endpoint, level):
    """Waits (bounded) for the server to go idle, then the leak and memory verdict."""
    end = time.perf_counter() + args.idle_wait
    final = sample(args, endpoint, level["duration_s"])
    while time.perf_counter() < end:
        if final.get("kv_blocks_used", 0) == 0 and final.get("requests_running", 0) == 0:
            break
        time.sleep(0.5)
        final = sample(args, endpoint, level["duration_s"] + args.idle_wait - (end - time.perf_counter()))
    samples = level["samples"] + [final]
    rss = [s["rss_kib"] for s in samples if s.get("rss_kib") is not None]
    mib = lambda k: round(k / 1024.0, 1)
    leaked = final.get("kv_blocks_used")
    rep = {
        "failed": level["failed"] + level["aborted"],
        "ok": level["ok"],
        "rss_first_mib": mib(rss[0]) if rss else None,
        "rss_last_mib": mib(rss[-1]) if rss else None,
        "rss_max_mib": mib(max(rss)) if rss else None,
        "kv_blocks_leaked": None if leaked is None else int(leaked),
        "requests_running_at_end": final.get("requests_running"),
        "samples": len(samples),
    }
    rep["pass"] = rep["failed"] == 0 and level["ok"] > 0 and (leaked is None or leaked == 0)
    return rep


def discover_model(endpoint):
    try:
        status, body = endpoint.get("/v1/models")
        if status == 200:
            data = json.loads(body).get("data") or []
            if data and data[0].get("id"):
                return data[0]["id"]
    except (OSError, http.client.HTTPException, ValueError, AttributeError):
        pass
    return "default"


def wait_ready(endpoint, seconds):
    end = time.perf_counter() + seconds
    while True:
        try:
            status, _ = endpoint.get("/health", timeout=2.0)
            if status == 200:
                return True
        except (OSError, http.client.HTTPException):
            pass
        if time.perf_counter() >= end:
            return False
        time.sleep(0.25)


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def table(report):
    lines = []
    cfg = report["config"]
    lines.append(f"# {cfg['url']}  model={cfg['model']}  seed={cfg['seed']}  prompts {cfg['prompt_tokens'][0]}-"
                 f"{cfg['prompt_tokens'][1]}  outputs {cfg['output_tokens'][0]}-{cfg['output_tokens'][1]}"
                 f"  prefix={cfg['prefix_tokens']}")
    head = (f"{'clients':>7} {'ok':>5} {'fail':>4} {'abrt':>4} {'short':>5} {'out tok/s':>10} {'req/s':>7} "
            f"{'TTFT p50':>9} {'p99':>8} {'ITL p50':>8} {'p99':>8} {'TPOT':>7} {'prompt':>7} {'cached':>7} {'dur s':>7} "
            f"{'load':>9}")
    lines.append(head)
    lines.append(" " * 57 + "(ms)" + " " * 14 + "(ms)" + " " * 10 + "(ms)")
    for lv in report["levels"]:
        lines.append(
            f"{lv['clients']:>7} {lv['ok']:>5} {lv['failed']:>4} {lv['aborted']:>4} {lv['short']:>5} "
            f"{fmt(lv['output_tokens_per_s']):>10} {fmt(lv['requests_per_s'], 2):>7} "
            f"{fmt(lv['ttft_ms']['p50']):>9} {fmt(lv['ttft_ms']['p99']):>8} "
            f"{fmt(lv['itl_ms']['p50']):>8} {fmt(lv['itl_ms']['p99']):>8} {fmt(lv['tpot_ms']['mean']):>7} "
            f"{fmt(lv['prompt_tokens_mean'], 0):>7} {fmt(lv['cached_tokens_mean'], 0):>7} {fmt(lv['duration_s']):>7} "
            f"{'-' if 'loadavg_1m' not in lv else '%.1f>%.1f' % tuple(lv['loadavg_1m']):>9}")
        for err, n in lv["errors"].items():
            lines.append(f"{'':>7} {n} x {err}")
        if lv["connect_ms"]["max"] is not None and lv["connect_ms"]["max"] > 200:
            c = lv["connect_ms"]
            lines.append(f"{'':>7} slow TCP connects: {c['n']} connections, p50 {fmt(c['p50'])} max {fmt(c['max'])} ms "
                         f"(a full listen backlog drops SYNs: retried after 1 s)")
        if lv["usage_missing"]:
            lines.append(f"{'':>7} {lv['usage_missing']} replies without usage: tokens counted as content chunks")
        lp = lv.get("long_prompt")
        if lp:
            if not lp["sent"]:
                lines.append(f"{'':>7} long prompt: {lp['note']}")
            else:
                d, o = lp["itl_during_ms"], lp["itl_outside_ms"]
                lines.append(
                    f"{'':>7} long prompt ({lp['prompt_tokens']} tokens) at {lp['at_s']} s: "
                    f"{'ok' if lp['ok'] else 'FAILED ' + str(lp['error'])}, TTFT {fmt(lp['ttft_ms'])} ms; "
                    f"{lp['streams_during']} other streams over its {fmt(lp['window_ms'])} ms prefill: "
                    f"ITL p50 {fmt(d['p50'])} p99 {fmt(d['p99'])} max {fmt(d['max'])} ms "
                    f"(n={d['n']}) vs p50 {fmt(o['p50'])} p99 {fmt(o['p99'])} ms outside; "
                    f"p99 during / median outside = {fmt(lp['p99_over_median_itl'], 2)}")
    soak = report.get("soak")
    if soak:
        lines.append(
            f"soak: {'PASS' if soak['pass'] else 'FAIL'}  ok {soak['ok']}  failed {soak['failed']}  "
            f"RSS first/last/max {fmt(soak['rss_first_mib'])}/{fmt(soak['rss_last_mib'])}/"
            f"{fmt(soak['rss_max_mib'])} MiB  KV blocks leaked "
            f"{'n/a (no tessera_kv_blocks_used)' if soak['kv_blocks_leaked'] is None else soak['kv_blocks_leaked']}"
            f"  ({soak['samples']} samples)")
    return "\n".join(lines)


def int_list(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"client counts must be >= 1: {text!r}")
    return values


def int_range(text):
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN-MAX, got {text!r}")
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return (lo, hi)


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--url", default="http://127.0.0.1:8080", help="base URL of the server (default %(default)s)")
    p.add_argument("--model", help="model name to send (default: the first id of GET /v1/models)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    p.add_argument("--clients", type=int_list, help="client counts, one level each (default 1,8,32,64; soak 64)")
    p.add_argument("--requests", type=int, help="at most this many requests per level (default 200; soak 1000000)")
    p.add_argument("--seconds", type=float, help="no request starts after this many seconds of a level "
                   "(default 120; soak 600)")
    p.add_argument("--drain-seconds", type=float, default=120.0,
                   help="requests still streaming this long after --seconds are cut (default %(default)s)")
    p.add_argument("--prompt-tokens", type=int_range, default=(100, 1000), metavar="MIN-MAX",
                   help="prompt length range, uniform (default 100-1000)")
    p.add_argument("--output-tokens", type=int_range, default=(50, 300), metavar="MIN-MAX",
                   help="output length range, uniform, forced with max_tokens + ignore_eos (default 50-300)")
    p.add_argument("--seed", type=int, default=1, help="seed of the request mix (default %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default %(default)s: greedy)")
    p.add_argument("--prefix-tokens", type=int, default=0,
                   help="a shared system prompt of about N tokens in every request (default 0: none)")
    p.add_argument("--long-prompt-at", type=float, metavar="T",
                   help="T seconds into each level, send one extra long-prompt request while the others stream")
    p.add_argument("--long-prompt-tokens", type=int, default=4000, help="its prompt length (default %(default)s)")
    p.add_argument("--long-prompt-output", type=int, default=16, help="its max_tokens (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1,
                   help="unmeasured short requests before the first level (default %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, help="socket timeout per read, s (default %(default)s)")
    p.add_argument("--wait-ready", type=float, default=0.0,
                   help="first poll GET /health until 200 for up to this many seconds (default 0: don't)")
    p.add_argument("--soak", action="store_true",
                   help="soak: 64 clients for 600 s, sampling RSS and /metrics; checks KV blocks return to 0")
    p.add_argument("--server-pid", type=int, help="soak: the server's pid, for VmRSS from /proc/PID/status")
    p.add_argument("--sample-every", type=float, default=10.0, help="soak: sampling period, s (default %(default)s)")
    p.add_argument("--idle-wait", type=float, default=30.0,
                   help="soak: wait up to this long for tessera_kv_blocks_used to reach 0 (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON line on stdout (table to stderr)")
    p.add_argument("--quiet", action="store_true", help="no table")
    p.add_argument("--self-test", action="store_true", help="check the statistics against an in-process mock server")
    return p


def finish_args(args, p):
    if args.clients is None:
        args.clients = [64] if args.soak else [1, 8, 32, 64]
    if args.requests is None:
        args.requests = 1000000 if args.soak else 200
    if args.seconds is None:
        args.seconds = 600.0 if args.soak else 120.0
    if args.requests < 1 or not (args.seconds > 0) or args.drain_seconds < 0:
        p.error("--requests and --seconds must be positive (every level is bounded by both)")
    if args.prefix_tokens < 0 or args.long_prompt_tokens < 1 or args.long_prompt_output < 1:
        p.error("--prefix-tokens must be >= 0, --long-prompt-tokens and --long-prompt-output >= 1")
    if args.long_prompt_at is not None and args.long_prompt_at < 0:
        p.error("--long-prompt-at must be >= 0")
    if args.sample_every <= 0:
        p.error("--sample-every must be positive")
    return args


def run(args, log=sys.stderr):
    endpoint = Endpoint(args.url, args.api_key, args.timeout)
    if args.wait_ready > 0 and not wait_ready(endpoint, args.wait_ready):
        raise SystemExit(f"serve_load: {args.url}/health did not answer 200 within {args.wait_ready} s")
    model = args.model or discover_model(endpoint)
    mix = Mix(args.seed, args.prompt_tokens, args.output_tokens, args.prefix_tokens)
    report = {
        "config": {
            "url": args.url, "model": model, "seed": args.seed, "clients": args.clients,
            "requests": args.requests, "seconds": args.seconds, "prompt_tokens": list(args.prompt_tokens),
            "output_tokens": list(args.output_tokens), "prefix_tokens": args.prefix_tokens,
            "temperature": args.temperature, "long_prompt_at": args.long_prompt_at,
            "long_prompt_tokens": args.long_prompt_tokens if args.long_prompt_at is not None else None,
            "soak": args.soak,
        },
        "levels": [],
    }
    if args.warmup > 0:
        # Unmeasured: other seeds' prompts, so the measured mix meets no cached prefix from them.
        wmix = Mix(args.seed + 7919, (16, 64), (4, 8), args.prefix_tokens)
        wl = Level(args, endpoint, wmix, model, 1, args.warmup, min(args.seconds, 60.0))
        wl.args = argparse.Namespace(**{**vars(args), "long_prompt_at": None, "soak": False})
        wl.run()
    for clients in args.clients:
        if log:
            print(f"serve_load: {clients} clients, up to {args.requests} requests / {args.seconds:g} s ...",
                  file=log, flush=True)
        load0 = os.getloadavg()[0]
        level = Level(args, endpoint, mix.salted(clients), model, clients, args.requests, args.seconds).run()
        level["loadavg_1m"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
        if args.soak:
            report["soak"] = soak_report(args, endpoint, level)
        report["levels"].append(level)
    return report


def exit_status(report):
    if any(lv["ok"] == 0 for lv in report["levels"]):
        return 1
    if "soak" in report and not report["soak"]["pass"]:
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Self-test: a mock OpenAI streaming server with known timings, and checks of what we measure.


class MockServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, ttft=0.03, itl=0.01, fail_every=0, cut_every=0, no_usage=False, stall=0.3,
                 long_words=1500, leak_blocks=0, api_key=None):
        super().__init__(("127.0.0.1", 0), MockHandler)
        self.ttft, self.itl, self.fail_every, self.cut_every = ttft, itl, fail_every, cut_every
        self.no_usage, self.stall, self.long_words, self.leak_blocks = no_usage, stall, long_words, leak_blocks
        self.api_key = api_key
        self.lock = threading.Lock()
        self.arrivals = 0
        self.running = 0
        self.stall_until = 0.0
        self.prompt_words = []

    def handle_error(self, request, client_address):
        pass  # clients cut on purpose (drain test): no tracebacks

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class MockHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def send_json(self, status, obj, extra=()):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        srv = self.server
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "mock-model", "object": "model"}]})
        elif self.path == "/metrics":
            with srv.lock:
                used = srv.running * 3 + srv.leak_blocks
                text = (f"# TYPE tessera_kv_blocks_used gauge\ntessera_kv_blocks_used {used}\n"
                        f"tessera_kv_blocks_free {1000 - used}\n"
                        f"tessera_requests_running {srv.running}\n"
                        f'tessera_requests_total{{endpoint="/v1/chat/completions",status="200"}} {srv.arrivals}\n')
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "not_found", "param": None, "code": 404}})

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def event(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        half = len(data) // 2  # split each event over two HTTP chunks: the reader must join them
        self.chunk(data[:half])
        self.chunk(data[half:])

    def do_POST(self):
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        if srv.api_key and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
            return self.send_json(401, {"error": {"message": "bad key", "type": "auth", "param": None, "code": 401}})
        with srv.lock:
            srv.arrivals += 1
            n = srv.arrivals
        if srv.fail_every and n % srv.fail_every == 0:
            return self.send_json(503, {"error": {"message": "mock overload", "type": "server_error",
                                                  "param": None, "code": 503}}, [("Retry-After", "1")])
        words = sum(len(m["content"].split()) for m in body["messages"])
        with srv.lock:
            srv.prompt_words.append(words)
            srv.running += 1
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": f"c{n}", "object": "chat.completion.chunk", "model": body["model"]}
            self.event({**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
            if words >= srv.long_words:  # a long prefill: every stream stalls meanwhile
                with srv.lock:
                    srv.stall_until = time.perf_counter() + srv.stall
                time.sleep(srv.stall)
            else:
                time.sleep(srv.ttft)
            for i in range(body["max_tokens"]):
                if i:
                    time.sleep(srv.itl)
                wait = srv.stall_until - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                self.event({**base, "choices": [{"index": 0, "delta": {"content": f" w{i}"}}]})
                if srv.cut_every and n % srv.cut_every == 0 and i == 2:
                    self.wfile.write(b"0\r\n\r\n")  # ends the stream without [DONE]
                    self.close_connection = True
                    return
            self.event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            if not srv.no_usage:
                self.event({**base, "choices": [], "usage": {
                    "prompt_tokens": words, "completion_tokens": body["max_tokens"],
                    "total_tokens": words + body["max_tokens"], "prompt_tokens_details": {"cached_tokens": 0}}})
            self.event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        finally:
            with srv.lock:
                srv.running -= 1


def self_test():
    failures = []

    def check(name, cond, detail=""):
        print(f"  {'ok  ' if cond else 'FAIL'} {name}{(': ' + detail) if detail else ''}", file=sys.stderr)
        if not cond:
            failures.append(name)

    def with_server(argv, **mock):
        srv = MockServer(**mock)
        t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        t.start()
        try:
            p = parser()
            args = finish_args(p.parse_args(["--url", srv.url, "--warmup", "0"] + argv), p)
            return run(args, log=None), srv
        finally:
            srv.shutdown()
            srv.server_close()

    print("serve_load self-test", file=sys.stderr)
    check("percentile", percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5
          and abs(percentile(list(range(101)), 99) - 99) < 1e-9 and percentile([], 50) is None)
    m = parse_metrics('# HELP x\nx 3\ny{a="1"} 2\ny{a="2",b="}"} 5.5\nz NaN\n')
    check("parse_metrics", m.get("x") == 3 and m.get("y") == 7.5, str(m))
    mix = Mix(3, (100, 1000), (50, 300), 0)
    a, b = mix.spec(5), Mix(3, (100, 1000), (50, 300), 0).spec(5)
    check("seeded mix is reproducible", a.text == b.text and a.max_tokens == b.max_tokens)
    check("levels get their own requests", mix.salted(8).spec(5).text == Mix(3, (100, 1000), (50, 300), 0, 8).spec(5).text
          and mix.salted(8).spec(5).text != mix.salted(32).spec(5).text)
    words = len(a.text.split()) + a.text.count(".")
    check("prompt length ~ requested", abs(words - a.prompt_tokens) <= 2, f"{words} vs {a.prompt_tokens}")

    # Plain closed loop: known TTFT 30 ms and ITL 10 ms, 1 of 7 refused, 1 of 11 cut mid-stream.
    rep, srv = with_server(["--clients", "1,6", "--requests", "40", "--seconds", "30", "--prompt-tokens", "20-60",
                            "--output-tokens", "5-12", "--seed", "4"], fail_every=7, cut_every=11)
    specs = [mix_spec for mix_spec in map(Mix(4, (20, 60), (5, 12), 0, salt=1).spec, range(40))]
    for lv in rep["levels"]:
        c = lv["clients"]
        check(f"[{c} clients] all 40 requests ran", lv["requests"] == 40, str(lv["requests"]))
        check(f"[{c} clients] failures counted", lv["failed"] >= 4 and lv["ok"] + lv["failed"] == 40,
              f"ok {lv['ok']} failed {lv['failed']} errors {lv['errors']}")
        check(f"[{c} clients] error kinds", any("HTTP 503: mock overload" in e for e in lv["errors"])
              and any("[DONE]" in e for e in lv["errors"]), str(lv["errors"]))
        check(f"[{c} clients] no short replies, usage read", lv["short"] == 0 and lv["usage_missing"] == 0)
        check(f"[{c} clients] TTFT p50 ~ 30 ms", 29 <= lv["ttft_ms"]["p50"] <= 100, str(lv["ttft_ms"]))
        check(f"[{c} clients] ITL p50 ~ 10 ms", 9 <= lv["itl_ms"]["p50"] <= 40, str(lv["itl_ms"]))
        check(f"[{c} clients] TPOT ~ 10 ms", 9 <= lv["tpot_ms"]["mean"] <= 40, str(lv["tpot_ms"]))
        check(f"[{c} clients] tok/s = tokens / duration",
              abs(lv["output_tokens_per_s"] - lv["output_tokens"] / lv["duration_s"]) < 0.05 * lv["output_tokens_per_s"])
    lv1, lv6 = rep["levels"]
    check("6 clients are faster than 1", lv6["output_tokens_per_s"] > 2.5 * lv1["output_tokens_per_s"],
          f"{lv6['output_tokens_per_s']} vs {lv1['output_tokens_per_s']}")
    total = sum(s.max_tokens for s in specs)
    check("ok + failed tokens <= the mix", lv1["output_tokens"] <= total)
    check("model discovered", rep["config"]["model"] == "mock-model")

    # No usage chunk: tokens counted from content chunks; and the request bound holds alone.
    rep, srv = with_server(["--clients", "3", "--requests", "9", "--seconds", "30", "--prompt-tokens", "10-20",
                            "--output-tokens", "7-7", "--api-key", "k1"], no_usage=True, api_key="k1")
    lv = rep["levels"][0]
    check("no usage: tokens from chunks", lv["ok"] == 9 and lv["output_tokens"] == 63 and lv["usage_missing"] == 9,
          f"ok {lv['ok']} tokens {lv['output_tokens']} errors {lv['errors']}")

    # Time bound: 2 clients, many requests, 1.5 s: stops on time, nothing aborted.
    t0 = time.perf_counter()
    rep, srv = with_server(["--clients", "2", "--requests", "100000", "--seconds", "1.5", "--prompt-tokens", "10-20",
                            "--output-tokens", "20-30"])
    lv = rep["levels"][0]
    check("time bound", time.perf_counter() - t0 < 5 and 0 < lv["requests"] < 100 and lv["aborted"] == 0,
          f"{lv['requests']} requests in {lv['duration_s']} s")
    # Drain bound: 60 tokens x 10 ms = 0.6 s per request, cut 0.2 s after a 0.3 s level.
    rep, srv = with_server(["--clients", "2", "--requests", "10", "--seconds", "0.3", "--drain-seconds", "0.2",
                            "--prompt-tokens", "10-20", "--output-tokens", "60-60"])
    lv = rep["levels"][0]
    check("drain bound cuts streams", lv["aborted"] == 2 and lv["ok"] == 0 and lv["duration_s"] < 1.5,
          f"aborted {lv['aborted']} ok {lv['ok']} {lv['duration_s']} s")

    # Long prompt: it stalls every other stream 300 ms while it prefills.
    rep, srv = with_server(["--clients", "4", "--requests", "40", "--seconds", "1.5", "--prompt-tokens", "10-20",
                            "--output-tokens", "30-40", "--long-prompt-at", "0.5", "--long-prompt-tokens", "2000"],
                           stall=0.3, long_words=1500)
    lp = rep["levels"][0]["long_prompt"]
    check("long prompt sent and ok", lp["sent"] and lp["ok"], str(lp))
    check("long prompt window ~ 300 ms", 280 <= lp["window_ms"] <= 600, str(lp["window_ms"]))
    check("ITL during it ~ 300 ms, outside ~ 10 ms",
          lp["streams_during"] >= 3 and lp["itl_during_ms"]["max"] >= 250 and lp["itl_outside_ms"]["p50"] <= 40
          and lp["p99_over_median_itl"] > 5, json.dumps(lp))
    check("long prompt not counted in the level", rep["levels"][0]["requests"] <= 40)
    check("long prompt text has ~2000 words", max(srv.prompt_words) >= 1700, str(max(srv.prompt_words)))

    # Prefix: the same system prompt in every request.
    rep, srv = with_server(["--clients", "2", "--requests", "4", "--seconds", "10", "--prompt-tokens", "10-10",
                            "--output-tokens", "3-3", "--prefix-tokens", "300"])
    check("prefix adds ~300 words", all(w >= 250 for w in srv.prompt_words), str(srv.prompt_words))

    # Soak: samples RSS of this process and the mock's KV gauge; then a leak.
    rep, srv = with_server(["--soak", "--clients", "4", "--seconds", "2", "--sample-every", "0.5",
                            "--server-pid", str(os.getpid()), "--prompt-tokens", "10-20", "--output-tokens", "5-10",
                            "--idle-wait", "3"])
    s = rep["soak"]
    check("soak passes on a clean server", s["pass"] and s["kv_blocks_leaked"] == 0 and s["rss_max_mib"]
          and s["samples"] >= 4, json.dumps(s))
    busy = [x.get("kv_blocks_used", 0) for x in rep["levels"][0]["samples"]]
    check("soak saw KV blocks in use", max(busy) > 0, str(busy))
    rep, srv = with_server(["--soak", "--clients", "2", "--seconds", "1", "--sample-every", "0.5",
                            "--prompt-tokens", "10-20", "--output-tokens", "5-10", "--idle-wait", "1"], leak_blocks=5)
    s = rep["soak"]
    check("soak reports leaked blocks", not s["pass"] and s["kv_blocks_leaked"] == 5 and exit_status(rep) == 1,
          json.dumps(s))
    check("table renders", "soak: FAIL" in table(rep))

    print(f"serve_load self-test: {'FAILED: ' + ', '.join(failures) if failures else 'all checks passed'}",
          file=sys.stderr)
    return 1 if failures else 0


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if args.self_test:
        return self_test()
    finish_args(args, p)
    try:
        report = run(args)
    except ValueError as e:
        p.error(str(e))
    if not args.quiet:
        print(table(report), file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
