#!/usr/bin/env bash
# The CPU benchmark of docs/PERF.md: trident bench on configs/bench-cpu.yaml, then PyTorch
# doing the same training step (scripts/bench_pytorch.py), on the same machine and threads.
# Usage: scripts/bench_cpu.sh [STEPS]   (build first: scripts/setup.sh --tests)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-10}
echo "== trident"
"$root/build/trident" bench --config "$root/configs/bench-cpu.yaml" --steps "$steps" | tail -1
echo "== pytorch"
/usr/bin/python3 "$root/scripts/bench_pytorch.py" --steps "$steps" --threads 2 | tail -1
