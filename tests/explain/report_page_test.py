#!/usr/bin/env python3
"""The report pages of `tessera profile --html` and `tessera plan --html` in a real browser:
headless Chromium (through Selenium) opens each file, the roofline chart renders with one point
per op row of the table (the time outside ops is a row but no point), the plan's throughput curve
has one vertex per batch of its sweep, and nothing on either page comes from elsewhere (no src or
href attributes, no script). Saves ARTIFACT_DIR/profile-report.png and plan-report.png.
    report_page_test.py TESSERA_BIN MODEL.gguf ARTIFACT_DIR
Exits 77 when selenium, chromium, chromedriver or the model is missing. Every wait is bounded."""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_util import browser_paths  # noqa: E402


def skip(reason):
    print(f"{reason}: skipped")
    sys.exit(77)


if len(sys.argv) != 4:
    print(__doc__)
    sys.exit(2)
tessera, model, artifacts = sys.argv[1:]
if not os.path.exists(model):
    skip(f"{model} is missing (scripts/install-deps.sh fetches it)")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:
    skip("selenium is missing (pip install selenium)")
chromium, chromedriver = browser_paths(skip)

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


os.makedirs(artifacts, exist_ok=True)
work = tempfile.mkdtemp(prefix="tessera-report-")
profile_page, plan_page = os.path.join(work, "profile.html"), os.path.join(work, "plan.html")
run = lambda args: subprocess.run([tessera, *args], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, timeout=300)
r = run(["profile", "--html", profile_page, "--out", os.path.join(work, "report.txt"), "--",
         "generate", "-m", model, "-p", "Hello", "-n", "8", "--threads", "1"])
check(r.returncode == 0, f"tessera profile --html exits 0 ({r.stderr.strip()[-200:]})")
r = run(["plan", "-m", model, "--context", "256", "--batch", "1,4,16", "--threads", "1",
         "--html", plan_page])
check(r.returncode == 0, f"tessera plan --html exits 0 ({r.stderr.strip()[-200:]})")

for page in (profile_page, plan_page):
    text = open(page).read()
    check("<script" not in text and " src=" not in text and " href=" not in text,
          f"{os.path.basename(page)} loads nothing from elsewhere")

opts = webdriver.ChromeOptions()
opts.binary_location = chromium
for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
          "--window-size=1280,1400", "--no-first-run", "--disable-extensions",
          "--disable-background-networking", f"--user-data-dir={os.path.join(work, 'chrome')}"]:
    opts.add_argument(a)
driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
driver.set_page_load_timeout(30)
try:
    driver.get("file://" + profile_page)
    chart = driver.find_elements(By.CSS_SELECTOR, "svg#roofline")
    check(len(chart) == 1 and chart[0].size["width"] > 100, "the profile's roofline renders")
    rows = driver.find_elements(By.CSS_SELECTOR, "table#ops tr")
    points = driver.find_elements(By.CSS_SELECTOR, "svg#roofline circle.op")
    # Rows: a header, one per op, and "(other)".
    check(len(rows) >= 3 and len(points) == len(rows) - 2,
          f"one point per op row ({len(points)} points, {len(rows)} rows)")
    check(len(driver.find_elements(By.CSS_SELECTOR, "svg#roofline line.roof")) >= 2,
          "the roofs are drawn")
    driver.save_screenshot(os.path.join(artifacts, "profile-report.png"))

    driver.get("file://" + plan_page)
    curve = driver.find_elements(By.CSS_SELECTOR, "svg#throughput polyline.curve")
    check(len(curve) == 1, "the plan's throughput curve renders")
    if curve:
        # The sweep doubles the batch from 1 to at least the largest asked for (16): 1..16.
        vertices = curve[0].get_attribute("points").split()
        check(len(vertices) == 5, f"one vertex per batch of the sweep ({len(vertices)})")
    decode_rows = driver.find_elements(By.CSS_SELECTOR, "table#decode tr")
    check(len(decode_rows) == 4, f"a row per batch asked for ({len(decode_rows) - 1})")
    check(len(driver.find_elements(By.CSS_SELECTOR, "svg#roofline circle.op")) > 0,
          "the plan's roofline has the largest step's ops")
    driver.save_screenshot(os.path.join(artifacts, "plan-report.png"))
finally:
    driver.quit()
    shutil.rmtree(work, ignore_errors=True)

print(f"{len(failures)} failed" if failures else "all passed")
sys.exit(1 if failures else 0)
