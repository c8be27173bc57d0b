#!/usr/bin/env bash
# The losses a GPU run must reproduce, computed on the CPU where the bundle is built and checked
# on the GPU machine (docs/GPU.md): each check is the default job (configs/default.yaml, on the
# corpus of scripts/prepare_kjv.sh) cut to 20 steps in fp32 with true fp32 products, in one of the
# model families. The CUDA tests compare the GPU with the CPU on the GPU machine itself; these
# numbers come from another machine, another CPU and another build of the CPU kernels, so a
# difference that both machines share cannot hide.
#
# Usage:
#   scripts/gpu_expected_losses.sh make TRIDENT DIR
#       runs each check on the CPU with the binary TRIDENT, writing DIR/<check>.losses (one loss a
#       line, step 1 first) and DIR/<check>.command
#   scripts/gpu_expected_losses.sh check TRIDENT DIR [RUNNER]
#       runs each check on the GPU (through RUNNER, a program that sets the environment, when
#       given) and compares every step's loss with DIR's: relative difference at most 1e-4 (the
#       CUDA tests' fp32 tolerance, tests/cuda/test_cli.cpp). Prints one "losses:" line a check.
# Environment: TRIDENT_CHECK_DATA (the corpus's folder, default data/kjv/gpt2), TRIDENT_CHECKS (the checks to run, default all), TRIDENT_CHECK_DEVICE (check's
# device, default cuda: tests/cuda/test_bundle.sh checks the comparison itself on the CPU).
# Run from the tree's root (the checks read configs/ and data/). Exit 0 when every check passes.
set -euo pipefail
mode=${1:?make or check} trident=${2:?the trident binary} dir=${3:?a directory}
runner=${4:-}
common=(--config configs/default.yaml --set training.steps=20 --set training.tf32=false
        --set training.micro_batch=4 --set training.global_batch=4
        --set data.train="${TRIDENT_CHECK_DATA:-data/kjv/gpt2}/train.bin"
        --set data.valid="${TRIDENT_CHECK_DATA:-data/kjv/gpt2}/valid.bin"
        --set training.eval_interval=20 --set logging.sample_tokens=0 --set logging.interval=5)
declare -A checks=(
  [gpt2]=""
  [llama]="--set model.arch=llama --set model.kv_heads=2"
)
names=${TRIDENT_CHECKS:-${!checks[*]}}
device=${TRIDENT_CHECK_DEVICE:-cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The training losses of a metrics file, one a line.
losses() { python3 -c 'import json,sys
for line in open(sys.argv[1]):
    record = json.loads(line)
    if "loss" in record: print(repr(record["loss"]))' "$1"; }

# Trains one check on a device: name, device; the losses go to $work/<name>.<device>.
train() {
  local name=$1 device=$2 settings
  read -ra settings <<< "${checks[$name]}"
  ${runner:+"$runner"} "$trident" train "${common[@]}" "${settings[@]}" --set device="$device" \
    --set checkpoint.dir="$work/$name.$device.ck" --set logging.metrics="$work/$name.$device.jsonl" \
    > "$work/$name.$device.log" 2>&1 || { tail -5 "$work/$name.$device.log"; return 1; }
  losses "$work/$name.$device.jsonl" > "$work/$name.$device"
  echo "trident train ${common[*]} ${checks[$name]} --set device=$device" > "$work/$name.command"
}

# Compares a check's GPU losses with the expected ones.
compare() {  # name
  python3 - "$dir/$1.losses" "$work/$1.$device" "$1" << 'EOF'
import sys
expected = [float(x) for x in open(sys.argv[1])]
got = [float(x) for x in open(sys.argv[2])]
name = sys.argv[3]
if len(got) != len(expected) or not expected:
    sys.exit(f"losses: {name}: {len(got)} steps run, {len(expected)} expected")
worst, step = max((abs(g - e) / abs(e), -i) for i, (g, e) in enumerate(zip(got, expected)))
step = 1 - step
print(f"losses: {len(got)} steps, worst relative difference {worst:.3e} (at most 1e-04): "
      f"{name} against the CPU losses shipped in the bundle, the worst at step {step}")
sys.exit(0 if worst <= 1e-4 else 1)
EOF
}

status=0
case $mode in
  make)
    mkdir -p "$dir"
    for name in $names; do
      train "$name" cpu
      cp "$work/$name.cpu" "$dir/$name.losses"
      cp "$work/$name.command" "$dir/$name.command"
      echo "expected: $name: $(wc -l < "$dir/$name.losses") losses, the last $(tail -1 "$dir/$name.losses")"
    done ;;
  check)
    for name in $names; do
      [[ -f $dir/$name.losses ]] || { echo "losses: $name: $dir/$name.losses is missing"; status=1; continue; }
      if train "$name" "$device"; then compare "$name" || status=1; else status=1; fi
    done ;;
  *) echo "gpu_expected_losses: make or check, not $mode" >&2; exit 2 ;;
esac
exit "$status"
