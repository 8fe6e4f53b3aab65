#!/usr/bin/env python3
"""The web page at / works in a real browser: headless Chromium (through Selenium) loads it from
`tessera serve` (started with an API-key file, on a free loopback port, one thread), sees the
model name once the key is typed (and a 401 error before), chats two turns (the answer streams in,
is shown as text, and the second request carries the first turn), stops a third answer midway,
and the dashboard shows a non-zero tokens/s. Saves ARTIFACT_DIR/serve-page.png.
    page_test.py TESSERA_BIN MODEL.gguf ARTIFACT_DIR
    page_test.py --mock ARTIFACT_DIR     (against tests/serve/page_mock.py instead)
Exits 77 when selenium, chromium or chromedriver is missing. Every wait is bounded."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_util import Checks, Server, browser_paths, free_port  # noqa: E402

KEY = "page-test-key"


def skip(reason):
    print(f"{reason}: skipped")
    sys.exit(77)


args = [a for a in sys.argv[1:] if a != "--mock"]
mock = len(args) != len(sys.argv) - 1
if (mock and len(args) not in (1, 3)) or (not mock and len(args) != 3):
    print(__doc__)
    sys.exit(2)
artifacts = args[-1]
if not mock:
    tessera, model = args[0], args[1]
    if not os.path.exists(model):
        skip(f"{model} is missing (scripts/fetch-model.sh fetches it)")

try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:
    skip("selenium is missing (pip install selenium)")
chromium, chromedriver = browser_paths(skip)


class MockServer(Server):
    """tests/serve/page_mock.py on a free loopback port, with Server's helpers."""

    def __init__(self, *mock_args, ready_s=20):
        self.port = free_port()
        self.log_path = f"/tmp/tessera-page-mock-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "page_mock.py"), "--port", str(self.port),
             *mock_args], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + ready_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("page_mock.py exited:\n" + self.output())
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError("page_mock.py did not become ready:\n" + self.output())


def wait_until(fn, seconds, step=0.1):
    """fn()'s first truthy value within `seconds`, else its last value."""
    deadline = time.time() + seconds
    while True:
        try:
            v = fn()
        except WebDriverException:
            v = None
        if v or time.time() > deadline:
            return v
        time.sleep(step)


def number(text):
    """The number in a dashboard value ("1,234.5 %" -> 1234.5); None for "–"."""
    digits = re.sub(r"[^0-9.]", "", text or "")
    return float(digits) if digits else None


def start_browser(profile):
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,860", "--lang=en-US", "--no-first-run",
              "--disable-extensions", "--disable-background-networking",
              f"--user-data-dir={profile}"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=chromedriver,
                      log_output=os.path.join(artifacts, "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


def run(server, driver, check):
    el = lambda id_: driver.find_element(By.ID, id_)  # noqa: E731
    text_of = lambda e: e.get_attribute("textContent") or ""  # noqa: E731
    assistants = lambda: driver.find_elements(By.CSS_SELECTOR, "#messages .assistant")  # noqa
    idle = lambda: driver.execute_script("return document.body.dataset.state") == "idle"  # noqa
    errors = lambda: driver.find_elements(By.CSS_SELECTOR, "#messages .error")  # noqa: E731
    meta = lambda e: text_of(e.find_element(By.CSS_SELECTOR, ".meta")) if e.find_elements(  # noqa
        By.CSS_SELECTOR, ".meta") else ""

    def send(text):
        box = el("chat-input")
        box.clear()
        box.send_keys(text)
        el("send").click()

    def wait_answer(count, seconds=120):
        """Waits for `count` assistant messages and an idle page; returns (answer, saw partial,
        tokens/s values seen meanwhile)."""
        seen, partial, errors_before = [], False, len(errors())
        deadline = time.time() + seconds
        while time.time() < deadline:
            seen.append(number(el("tokens-per-second").text))
            a = assistants()
            if len(a) >= count and not idle() and text_of(a[-1]).strip():
                partial = True
            if len(a) >= count and idle():
                return text_of(a[-1].find_element(By.CSS_SELECTOR, ".text")), partial, seen
            if len(errors()) > errors_before and idle():
                break
            time.sleep(0.1)
        return None, partial, seen

    driver.get(server.url() + "/")
    check("tessera serve" in driver.title, f"the page loads (title {driver.title!r})")
    live = wait_until(lambda: "live" in el("metrics-status").text, 10)
    check(live, "the dashboard reads /metrics: " + el("metrics-status").text)

    # Without the API key: the model list and the chat are refused, and the page says so.
    check(wait_until(lambda: "API key" in el("model-name").text, 10),
          f"without the key the header asks for one ({el('model-name').text!r})")
    question = "Hi! What is <b>2+2</b>? Answer in one short sentence."
    el("chat-input").send_keys(question)
    el("send").click()
    shown = wait_until(lambda: idle() and errors(), 20)
    check(shown and "401" in shown[0].text,
          "a 401 is shown as an error: " + (shown[0].text if shown else "nothing shown"))
    check(el("chat-input").get_attribute("value") == question,
          "the refused message is back in the message box")
    check(not assistants() and not driver.find_elements(By.CSS_SELECTOR, "#messages .user"),
          "the refused turn left no messages, only the error")

    # With the key: the model name appears and the key is kept in localStorage.
    el("api-key").send_keys(KEY, Keys.TAB)
    _, _, models = server.request("GET", "/v1/models",
                                  headers={"Authorization": "Bearer " + KEY}, timeout=10)
    want = re.search(rb'"id"\s*:\s*"([^"]*)"', models).group(1).decode()
    check(wait_until(lambda: el("model-name").text == want, 10),
          f"with the key the header names the model ({el('model-name').text!r}, want {want!r})")
    stored = driver.execute_script("return localStorage.getItem('tessera.apiKey')")
    check(stored == KEY, f"the key is kept in localStorage ({stored!r})")

    # Turn 1: settings for a short, greedy answer; the answer streams in as text.
    driver.find_element(By.CSS_SELECTOR, "details.settings summary").click()
    for id_, v in [("max-tokens", "40"), ("temperature", "0")]:
        el(id_).clear()
        el(id_).send_keys(v)
    el("send").click()   # the refused question is still in the box
    answer1, partial, seen = wait_answer(1)
    check(answer1 and answer1.strip(), f"turn 1 answered: {answer1!r}")
    check(len(errors()) == 1, "no error shown but the 401's: "
          + "; ".join(e.text for e in errors()[1:]))
    if mock:  # a local model may finish between two looks
        check(partial, "the answer was seen while it streamed")
    users = driver.find_elements(By.CSS_SELECTOR, "#messages .user .text")
    check(len(users) == 1 and text_of(users[0]) == question,
          "the question is shown once, as typed (as text)")
    check(not driver.find_elements(By.CSS_SELECTOR, "#messages b, #messages img"),
          "no markup from the conversation became elements")
    peak = wait_until(lambda: number(el("tokens-per-second-peak").text), 10)
    most = max(filter(None, seen), default=0)
    check((peak or 0) > 0 or most > 0,
          f"the dashboard showed a non-zero tokens/s (peak {peak}, seen {most})")

    # Turn 2: the request carries the first turn (its prompt is longer than turn 1's prompt
    # and answer together).
    send("Now multiply that by ten.")
    answer2, _, _ = wait_answer(2)
    check(answer2 and answer2.strip(), f"turn 2 answered: {answer2!r}")
    metas = [meta(a) for a in assistants()]
    prompts = [int(m.group(1)) if (m := re.search(r"prompt (\d+)", t)) else None for t in metas]
    got = re.search(r"(\d+) tokens", metas[0])
    check(None not in prompts and got and prompts[1] >= prompts[0] + int(got.group(1)),
          f"turn 2's prompt holds turn 1 (prompt tokens {prompts}; {metas})")
    if mock:
        check("(3 messages" in answer2, "the mock got 3 messages in turn 2")
    wait_until(lambda: number(el("kv-usage").text) is not None, 5)
    for id_ in ["prompt-tokens-per-second", "requests-running", "requests-waiting", "kv-usage",
                "prefix-hit-rate", "memory-read", "memory-roof"]:
        check(el(id_).text.strip() not in ("", "–"), f"dashboard {id_}: {el(id_).text!r}")
    time.sleep(2.5)   # a dashboard update or two after the answer
    driver.save_screenshot(os.path.join(artifacts, "serve-page.png"))

    # Turn 3: stopped midway; the page goes idle and the server lets the request go.
    el("max-tokens").clear()
    el("max-tokens").send_keys("400")
    send("Count from 1 to 300, separated by commas.")
    started = wait_until(lambda: len(assistants()) == 3 and text_of(assistants()[-1]).strip(), 60)
    check(started, "turn 3 started streaming")
    stop_visible = el("stop").is_displayed()
    if not idle():
        el("stop").click()
    check(wait_until(idle, 10), "the page is idle after stop")
    last = meta(assistants()[-1]) if assistants() else ""
    check(stop_visible and "stopped" in last, f"the answer is marked stopped ({last!r})")
    running = server.wait_metric("tessera_requests_running", lambda v: v == 0, 30)
    check(running == 0, f"the server let the stopped request go (running {running})")

    if mock:  # an error event in the middle of a stream: shown, and the partial answer kept
        send("STREAMERROR please")
        wait_until(lambda: len(assistants()) == 4 and idle(), 20)
        shown = errors()[-1].text if errors() else ""
        partial = text_of(assistants()[-1]) if len(assistants()) == 4 else ""
        check("mock stream error" in shown and partial.startswith("Mock answer"),
              f"an error mid-stream is shown ({shown!r}) after the partial answer ({partial!r})")

    # "New chat" empties the conversation.
    el("clear").click()
    check(not assistants() and el("empty-note").is_displayed(), "New chat empties the page")

    logs = [e for e in driver.get_log("browser")
            if e.get("level") == "SEVERE" and "Failed to load resource" not in e.get("message", "")]
    check(not logs, "no script errors in the console: " + "; ".join(e["message"] for e in logs))


def main():
    os.makedirs(artifacts, exist_ok=True)
    check = Checks()
    server = driver = None
    profile = tempfile.mkdtemp(prefix="tessera-page-test-")
    key_file = os.path.join(profile, "keys.txt")
    with open(key_file, "w") as f:
        f.write(KEY + "\n")

    def give_up(*_):
        raise TimeoutError("page_test.py ran past its 600 s limit")
    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(600)
    try:
        if mock:
            server = MockServer("--api-key", KEY)
        else:
            server = Server(tessera, model, "--api-key-file", key_file, threads=1)
        driver = start_browser(os.path.join(profile, "chromium"))
        run(server, driver, check)
    except Exception as e:  # noqa: BLE001: reported as a failed check
        check(False, f"the test ran to the end ({type(e).__name__}: {e})")
        if driver:
            try:
                driver.save_screenshot(os.path.join(artifacts, "serve-page-failure.png"))
            except WebDriverException:
                pass
    finally:
        signal.alarm(0)
        if driver:
            try:
                driver.quit()
            except Exception:  # noqa: BLE001
                driver.service.stop()
        if server:
            server.kill()
            with open(os.path.join(artifacts, "serve-page-server.log"), "w") as f:
                f.write(server.output())
        shutil.rmtree(profile, ignore_errors=True)
    check.done()


main()
