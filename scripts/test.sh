#!/usr/bin/env bash
# Every test: install and build if needed, then run the whole ctest suite (Catch2 unit tests,
# command-line tests and the PyTorch reference tests).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --tests
cd "$root/build"
ctest --output-on-failure -j "$(nproc)"
