#!/usr/bin/env python3
"""Two `tessera serve` replicas behind sglang-router (PyPI sglang-router==0.3.2, its cache-aware
policy), all on 127.0.0.1:

  router_test.py TESSERA_BIN MODEL.gguf     the real server (threads 1 per replica)
  router_test.py --mock                     stand-in workers (router_mock.py), to test the test

Checks: the router accepts both replicas; chat and completions, streamed or not, pass through it;
the model id the router lists is accepted; a long shared prefix (about 1000 tokens) keeps going
to one replica (X-Tessera-Replica header) and hits its prefix cache there (its /metrics
tessera_prefix_cache_hit_tokens_total); distinct prefixes sent together spread over both; then one
replica is SIGKILLed while requests run: every request that had not received a streamed token
from it still succeeds (the router retries it on the other), later requests go to the survivor,
and the router marks the dead one unhealthy. Exits 77 when sglang_router is not importable in
this Python. Every process it starts is killed on every way out; every wait is bounded."""
import atexit
import http.client
import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_util  # noqa: E402

ROUTER_PACKAGE = "sglang-router==0.3.2"
TOTAL_SECONDS = 720  # the whole test; CTest's limit for the serve tests is 900
START = time.monotonic()
PROCS = []  # every process this test started, killed at exit


def remaining(cap):
    """Seconds a wait may take: at most cap, never past the test's deadline."""
    return max(1.0, min(cap, TOTAL_SECONDS - (time.monotonic() - START)))


def kill_all():
    for p in reversed(PROCS):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # each was started in a session of its own
            except OSError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def on_signal(signum, _frame):
    kill_all()
    sys.exit(128 + signum)


def spawn(cmd, log_path):
    log = open(log_path, "w")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    log.close()
    PROCS.append(p)
    return p


def tail(path, n=25):
    """The last n lines of a log, without the router's colour codes."""
    try:
        with open(path, errors="replace") as f:
            return re.sub(r"\x1b\[[0-9;]*m", "", "".join(f.readlines()[-n:]))
    except OSError:
        return ""


class Replica:
    """A `tessera serve` (or router_mock.py) on a free loopback port, ready once /health is 200."""

    def __init__(self, mock, tessera=None, model=None):
        self.port = serve_util.free_port()
        self.name = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.name}"  # where the router reaches it
        self.log = f"/tmp/tessera-router-test-replica-{self.port}.log"
        if mock:
            cmd = [sys.executable, os.path.join(HERE, "router_mock.py"), "--port",
                   str(self.port), "--delay-ms", "300", "--token-ms", "40"]
        else:
            cmd = [tessera, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
                   "--threads", "1", "--kv-memory", "256MiB"]
        self.proc = spawn(cmd, self.log)

    def wait_ready(self, seconds=120):
        deadline = time.monotonic() + remaining(seconds)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited with {self.proc.returncode}:\n"
                                   + tail(self.log))
            try:
                if get(self.port, "/health", 2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"replica {self.name} not ready in {seconds} s:\n" + tail(self.log))

    def gauge(self, name):
        """A metric without labels from /metrics; None when absent or unreachable."""
        try:
            _, _, body = get(self.port, "/metrics", 10)
        except OSError:
            return None
        for line in body.decode(errors="replace").splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return None

    def hit_tokens(self):
        return self.gauge("tessera_prefix_cache_hit_tokens_total")


def get(port, path, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


class Result:
    """One request through the router: status, the replica that answered, whether it completed
    (non-stream: a JSON body with choices; stream: events and data: [DONE]), and when its first
    streamed event arrived."""

    def __init__(self, what):
        self.what = what
        self.status = None
        self.replica = None
        self.ok = False
        self.events = 0
        self.first_event = None
        self.usage = None
        self.error = ""

    def __repr__(self):
        return (f"{self.what}: status {self.status} replica {self.replica} ok {self.ok} "
                f"events {self.events} {self.error}")


def call(port, path, body, what, timeout=300, res=None):
    """Sends one request; fills (and returns) res, which another thread may watch meanwhile."""
    res = res or Result(what)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=remaining(timeout))
    try:
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        res.status = r.status
        res.replica = r.getheader("X-Tessera-Replica")
        if r.status != 200:
            res.error = r.read()[:300].decode(errors="replace")
            return res
        if not body.get("stream"):
            data = json.loads(r.read())
            res.usage = data.get("usage")
            res.ok = bool(data.get("choices"))
            if not res.ok:
                res.error = "no choices"
            return res
        done = False
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            if ev.get("usage"):
                res.usage = ev["usage"]
            if ev.get("choices"):
                res.events += 1
                if res.first_event is None:
                    res.first_event = time.monotonic()
        res.ok = done and res.events > 0
        if not res.ok:
            res.error = f"stream ended without [DONE] after {res.events} events"
    except (OSError, ValueError, http.client.HTTPException) as e:
        res.error = repr(e)[:200]
    finally:
        conn.close()
    return res


def chat(model, system, user, n, stream=False):
    body = {"model": model, "max_tokens": n, "temperature": 0, "stream": stream,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def completion(model, prompt, n, stream=False):
    return {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0,
            "stream": stream}


WORDS = ("river stone light garden window paper morning silver forest music winter letter "
         "orange market bridge candle harbor meadow journey lantern thunder pocket mirror "
         "village engine feather castle ladder ribbon planet blanket saddle kettle compass "
         "valley anchor violin pepper island marble velvet copper tunnel orchard canyon "
         "meadow falcon glacier ember quartz willow cobalt prairie summit lagoon").split()


def long_text(seed, words=880):
    """About 1000 tokens of deterministic text that no other seed shares a prefix with."""
    rnd = random.Random(seed)
    out = [f"Document {seed}."]
    for i in range(words):
        out.append(rnd.choice(WORDS) + ("." if i % 12 == 11 else ""))
    return " ".join(out)


def in_thread(port, path, body, what):
    """Starts call() in a thread; returns (thread, its Result, filled as the answer comes)."""
    res = Result(what)
    t = threading.Thread(target=call, args=(port, path, body, what), kwargs={"res": res},
                         daemon=True)
    t.start()
    return t, res


def main():
    argv = sys.argv[1:]
    mock = "--mock" in argv
    argv = [a for a in argv if a != "--mock"]
    if importlib.util.find_spec("sglang_router") is None:
        print(f"sglang_router is not importable by {sys.executable} "
              f"(pip install {ROUTER_PACKAGE}): skipped")
        sys.exit(77)
    tessera = model_path = None
    if not mock:
        if len(argv) < 2:
            print(f"usage: {sys.argv[0]} TESSERA_BIN MODEL.gguf | --mock")
            sys.exit(2)
        tessera, model_path = argv[0], argv[1]
        if not os.path.exists(model_path):
            print(f"{model_path} is missing (scripts/fetch-model.sh fetches it): skipped")
            sys.exit(77)
    atexit.register(kill_all)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    check = serve_util.Checks()
    replicas = [Replica(mock, tessera, model_path) for _ in range(2)]
    for r in replicas:
        r.wait_ready()
    by_name = {r.name: r for r in replicas}
    model = json.loads(get(replicas[0].port, "/v1/models")[2])["data"][0]["id"]

    # The router, on loopback only (its Prometheus listener too: it defaults to 0.0.0.0:29000).
    rport, pport = serve_util.free_port(), serve_util.free_port()
    rlog = f"/tmp/tessera-router-test-router-{rport}.log"
    router_cmd = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(rport),
        "--worker-urls", *[r.url for r in replicas],
        "--policy", "cache_aware",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(pport),
        "--log-level", "warn",
        # A dead replica is found by /health within about 2 s; until then the router's retries
        # (10 attempts, 0.2 s growing to 2 s apart, about 10 s in all) keep each request alive.
        "--health-check-interval-secs", "1", "--health-check-timeout-secs", "5",
        "--health-failure-threshold", "2", "--health-success-threshold", "1",
        "--retry-max-retries", "10", "--retry-initial-backoff-ms", "200",
        "--retry-max-backoff-ms", "2000",
        # Its circuit breaker counts every non-2xx answer, a client's 400 too: a few bad
        # requests would shut a healthy replica out, so it is off.
        "--disable-circuit-breaker",
        "--request-timeout-secs", "600", "--worker-startup-timeout-secs", "60",
    ]
    print("router:", " ".join(router_cmd))
    router = spawn(router_cmd, rlog)
    ready = None
    deadline = time.monotonic() + remaining(60)
    while time.monotonic() < deadline and router.poll() is None:
        try:
            st, _, b = get(rport, "/readiness", 2)
            if st == 200 and json.loads(b).get("healthy_workers") == 2:
                ready = json.loads(b)
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    if not check(ready is not None, "the router is up with both replicas healthy"):
        print(tail(rlog))
        check.done()

    # Plain traffic through the router.
    basic = [
        call(rport, "/v1/chat/completions", chat(model, "You are terse.", "Say hi.", 8), "chat"),
        call(rport, "/v1/chat/completions", chat(model, "You are terse.", "Say hi.", 8, True),
             "chat stream"),
        call(rport, "/v1/completions", completion(model, "Once upon a time", 8), "completion"),
        call(rport, "/v1/completions", completion(model, "Once upon a time", 8, True),
             "completion stream"),
    ]
    for r in basic:
        check(r.ok, f"{r.what} through the router succeeds ({r})")
        check(r.replica in by_name, f"{r.what}: X-Tessera-Replica names a replica ({r.replica})")
    st, _, b = get(rport, "/v1/models")
    listed = json.loads(b)["data"][0]["id"] if st == 200 else None
    r = call(rport, "/v1/chat/completions", chat(listed, "You are terse.", "Say hi.", 4),
             "chat with the router's model id")
    check(r.ok, f"the model id the router lists ({listed!r}) is accepted ({r})")

    # Prefix affinity: two long system prompts sent together land on the two replicas (the
    # cache-aware policy sends a prefix it has not seen to the least loaded one); each one's
    # later requests follow it there and hit that replica's prefix cache.
    prefixes = [long_text(1), long_text(2)]
    firsts = []
    for i, p in enumerate(prefixes):
        firsts.append(in_thread(rport, "/v1/chat/completions",
                                chat(model, p, "Summarize in one word.", 4), f"prefix {i} first"))
        # The second goes once the first runs on a replica, so that the router counts it.
        deadline = time.monotonic() + remaining(10)
        while i == 0 and time.monotonic() < deadline and firsts[0][0].is_alive():
            if any(rep.gauge("tessera_requests_running") or rep.gauge("tessera_requests_waiting")
                   for rep in replicas):
                break
            time.sleep(0.02)
    owners, first_prompt = [], []
    for t, r in firsts:
        t.join(remaining(300))
        check(not t.is_alive() and r.ok, f"first request of a long prefix succeeds ({r})")
        owners.append(r.replica if r.ok else None)
        first_prompt.append((r.usage or {}).get("prompt_tokens", 0))
    print("long prefix prompt tokens:", first_prompt, "replicas:", owners)
    check(None not in owners and len(set(owners)) == 2,
          f"two new long prefixes sent together go to different replicas ({owners})")
    hits_before = {r.name: r.hit_tokens() for r in replicas}
    repeat_tokens = {r.name: 0 for r in replicas}
    for k in range(2):
        for i, p in enumerate(prefixes):
            r = call(rport, "/v1/chat/completions",
                     chat(model, p, f"Question {k}: name a color.", 4), f"prefix {i} repeat {k}")
            check(r.ok and r.replica == owners[i],
                  f"prefix {i} repeat {k} goes to the same replica {owners[i]} ({r})")
            if r.ok and r.replica in repeat_tokens:
                repeat_tokens[r.replica] += (r.usage or {}).get("prompt_tokens", 0)
    for rep in replicas:
        if repeat_tokens[rep.name] == 0:
            continue
        before, after = hits_before[rep.name], rep.hit_tokens()
        gained = (after or 0) - (before or 0)
        check(after is not None and gained >= 0.5 * repeat_tokens[rep.name],
              f"replica {rep.name}: tessera_prefix_cache_hit_tokens_total grew by {gained:.0f} "
              f"over repeats of {repeat_tokens[rep.name]} prompt tokens (at least half cached)")

    # A replica dies: SIGKILL the one that owns prefix 0 while requests run on it.
    victim_name = owners[0] if owners[0] in by_name else replicas[0].name
    victim = by_name[victim_name]
    survivor = next(r for r in replicas if r is not victim)
    jobs = []

    def launch(path, body, what):
        jobs.append(in_thread(rport, path, body, what))

    for j in range(2):
        launch("/v1/chat/completions",
               dict(chat(model, prefixes[0], f"Tell a story {j}.", 48, True), ignore_eos=True),
               f"long stream {j} on prefix 0")
    launch("/v1/chat/completions",
           dict(chat(model, prefixes[1], "Tell a story.", 48, True), ignore_eos=True),
           "long stream on prefix 1")
    # Wait (bounded) until a stream on prefix 0 has its first token, then add requests that are
    # in flight (queued or in prefill) when the replica dies.
    deadline = time.monotonic() + remaining(180)
    while time.monotonic() < deadline:
        if any(r.first_event is not None or not t.is_alive() for t, r in jobs[:2]):
            break
        time.sleep(0.05)
    check(any(r.replica == victim.name and r.first_event is not None and not r.ok
              for _, r in jobs[:2]),
          f"a stream on prefix 0 is running on {victim.name} when it is killed")
    launch("/v1/chat/completions", chat(model, prefixes[0], "In flight, not streamed.", 8),
           "in-flight request on prefix 0")
    launch("/v1/completions", completion(model, prefixes[0] + " And then", 8, True),
           "in-flight stream on prefix 0")
    time.sleep(0.3)
    try:
        _, _, b = get(victim.port, "/metrics", 2)
        gauges = [line for line in b.decode(errors="replace").splitlines()
                  if line.startswith(("tessera_requests_running", "tessera_requests_waiting"))]
        print(f"on {victim.name} just before the kill:", ", ".join(gauges))
    except OSError:
        pass
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(timeout=10)
    print(f"killed replica {victim.name} (SIGKILL)")
    after = [
        call(rport, "/v1/chat/completions", chat(model, prefixes[0], "After the kill.", 8),
             "after kill: chat on prefix 0"),
        call(rport, "/v1/chat/completions", chat(model, prefixes[0], "After the kill.", 8, True),
             "after kill: chat stream on prefix 0"),
        call(rport, "/v1/completions", completion(model, prefixes[1] + " Then", 8),
             "after kill: completion on prefix 1"),
        call(rport, "/v1/completions", completion(model, "A short one", 8, True),
             "after kill: short completion stream"),
    ]
    for r in after:
        check(r.ok and r.replica == survivor.name,
              f"{r.what} succeeds on the survivor {survivor.name} ({r})")
    cut = 0
    for t, r in jobs:
        t.join(remaining(300))
        if t.is_alive():
            check(False, f"{r.what} finished in time")
            continue
        # Events from the dead replica were sent before it died: such a stream had started.
        if r.replica == victim.name and r.first_event is not None and not r.ok:
            cut += 1
            print(f"allowed: {r.what} had streamed from the dead replica and was cut ({r})")
            continue
        check(r.ok, f"{r.what}: not lost by the kill ({r})")
    print(f"{cut} stream(s) cut mid-way by the kill (allowed)")
    healthy = None
    deadline = time.monotonic() + remaining(20)
    while time.monotonic() < deadline:
        try:
            st, _, b = get(rport, "/workers", 5)
            ws = {w["url"]: w["is_healthy"] for w in json.loads(b)["workers"]}
            healthy = ws.get(victim.url)
            if healthy is False:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    check(healthy is False, f"the router marks the dead replica unhealthy (is_healthy {healthy})")

    if check.failures:
        print("--- router log (tail)\n" + tail(rlog))
        for r in replicas:
            print(f"--- replica {r.name} log (tail)\n" + tail(r.log, 15))
    kill_all()
    check.done()


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a replica that did not start
        print(f"FAIL: {e}")
        kill_all()
        sys.exit(1)
