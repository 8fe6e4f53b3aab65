"""Shared by the server's tests: start `tessera serve` on a free loopback port and stop it, talk
to it with the standard library (JSON and server-sent events), read /metrics, and count checks.
Every wait is bounded."""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def browser_paths(skip):
    """Chromium's and chromedriver's paths for Selenium; skip(reason), which exits 77, where
    either is missing."""
    chromium = next(filter(None, map(shutil.which, ["chromium", "chromium-browser",
                                                    "google-chrome"])), None)
    chromedriver = shutil.which("chromedriver") or next(
        (p for p in ["/usr/lib/chromium/chromedriver"] if os.path.exists(p)), None)
    if not chromium:
        skip("chromium is missing (apt-get install chromium)")
    if not chromedriver:
        skip("chromedriver is missing (apt-get install chromium-driver)")
    return chromium, chromedriver


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`tessera serve` on 127.0.0.1 with `args`; waits (up to `ready_s`) for /health."""

    def __init__(self, tessera, model, *args, ready_s=120, threads=2, kv_memory="256MiB"):
        self.port = free_port()
        self.log_path = f"/tmp/tessera-serve-test-{self.port}.log"
        self.log = open(self.log_path, "w")
        cmd = [tessera, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(self.port),
               "--threads", str(threads), "--kv-memory", kv_memory, *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + ready_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tessera serve exited with {self.proc.returncode}:\n"
                                   + self.output())
            try:
                status, _, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError("tessera serve did not become ready:\n" + self.output())

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def post(self, path, body, headers=None, timeout=300):
        status, hdrs, data = self.request("POST", path, body, headers, timeout)
        try:
            return status, hdrs, json.loads(data)
        except ValueError:
            return status, hdrs, data

    def stream(self, path, body, headers=None, timeout=300):
        """Posts with stream true; returns (status, list of parsed events, saw [DONE])."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers or {})
            r = conn.getresponse()
            if r.status != 200:
                return r.status, [json.loads(r.read())], False
            events, done = [], False
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                events.append(json.loads(line[6:]))
            return r.status, events, done
        finally:
            conn.close()

    def metrics(self):
        """{name or name{labels}: value} from /metrics."""
        _, _, body = self.request("GET", "/metrics", timeout=10)
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def wait_metric(self, name, pred, seconds=30):
        """Polls /metrics until pred(value) holds; returns the last value."""
        deadline = time.time() + seconds
        while True:
            v = self.metrics().get(name)
            if v is not None and pred(v):
                return v
            if time.time() > deadline:
                return v
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM, seconds=60):
        """Signals the server and waits for it; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        self.log.close()


class Checks:
    """Counts checks; `done()` prints the summary and exits non-zero on any failure."""

    def __init__(self):
        self.failures = []
        self.count = 0

    def __call__(self, cond, what):
        self.count += 1
        if cond:
            print("ok:", what)
        else:
            self.failures.append(what)
            print("FAIL:", what)
        return cond

    def done(self):
        print(f"{self.count - len(self.failures)} of {self.count} checks passed")
        sys.exit(1 if self.failures else 0)


def generate_alone(tessera, model, prompt, n, system=None, threads=2):
    """The text `tessera generate` gives for a chat prompt, greedy, alone in its process."""
    cmd = [tessera, "generate", "-m", model, "-p", prompt, "-n", str(n), "--temperature", "0",
           "--threads", str(threads), "--no-stats"]
    if system:
        cmd += ["--system", system]
    out = subprocess.run(cmd, capture_output=True, timeout=300, check=True)
    text = out.stdout.decode()
    return text[:-1] if text.endswith("\n") else text


def env_tessera_model():
    if len(sys.argv) < 3:
        print(f"usage: {sys.argv[0]} TESSERA_BIN MODEL.gguf")
        sys.exit(2)
    tessera, model = sys.argv[1], sys.argv[2]
    if not os.path.exists(model):
        print(f"{model} is missing (scripts/fetch-model.sh fetches it): skipped")
        sys.exit(77)
    return tessera, model
