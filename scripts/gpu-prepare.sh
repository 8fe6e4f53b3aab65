#!/usr/bin/env bash
# Downloads (here, where the Debian mirrors are reachable) the .deb packages the build needs at
# configure and link time on the device machine, which reaches no package registry. They go to
# .gpu-deps/ (git-ignored); a device run carries that folder and scripts/gpu-check.sh unpacks it
# with dpkg -x into a prefix under /tmp.
#
# Usage: scripts/gpu-prepare.sh [--update]   (--update runs apt-get update first)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.gpu-deps"
# find_package() calls: hwy (REQUIRED), nlohmann_json (REQUIRED), GTest (REQUIRED; its CMake
# config also names libgmock.a, so libgmock-dev must be present), benchmark (bench/, QUIET).
# Runtime libraries for the shared ones: libhwy1, libbenchmark1debian.
packages=(libhwy-dev libhwy1 nlohmann-json3-dev libgtest-dev libgmock-dev googletest
          libbenchmark-dev libbenchmark1debian)
limit_mib=60

if [[ "${1:-}" == "--update" ]]; then apt-get update; fi
mkdir -p "$dest"
rm -f "$dest"/*.deb
(cd "$dest" && apt-get download "${packages[@]}")

total_kib=$(du -sk "$dest" | cut -f1)
echo "gpu-prepare: $(ls "$dest"/*.deb | wc -l) packages, $((total_kib / 1024)) MiB in $dest"
ls -s "$dest"
if ((total_kib > limit_mib * 1024)); then
  echo "gpu-prepare: $dest is over ${limit_mib} MiB; a device run carries at most 64 MiB" >&2
  exit 1
fi
