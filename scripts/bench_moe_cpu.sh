#!/usr/bin/env bash
# The mixture of experts' CPU benchmark of docs/PERF.md: trident bench on
# configs/moe-small-cpu.yaml, then PyTorch doing the same training step (scripts/bench_pytorch.py
# with the experts of scripts/torch_llama.py, written as Hugging Face's Mixtral writes them), on
# the same machine and 2 threads, one after the other.
# Usage: scripts/bench_moe_cpu.sh [STEPS]   (build first: scripts/setup.sh --tests)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${1:-10}
echo "== trident"
"$root/build/trident" bench --config "$root/configs/moe-small-cpu.yaml" --steps "$steps" \
  --warmup 1 | tail -1
echo "== pytorch"
/usr/bin/python3 "$root/scripts/bench_pytorch.py" --arch llama --vocab 50257 --seq 128 \
  --layers 4 --hidden 256 --heads 4 --kv-heads 2 --ffn 256 --experts 8 --top-k 2 --shared 1 \
  --batch 16 --steps "$steps" --warmup 1 --threads 2 | tail -1
