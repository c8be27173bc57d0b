#!/usr/bin/env bash
# Every test: install and build if needed, then run the whole ctest suite (Catch2 unit tests,
# command-line tests and the PyTorch reference tests). Arguments go on to ctest (e.g. -R python).
#
# A test that exits 77 is counted by ctest as skipped, not failed. Set-up installs everything
# the tests need but a GPU, so any other skip means something is broken: the run then fails,
# naming the skipped tests. The GPU tests (label cuda) may skip, and are listed when they do.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" --tests
cd "$root/build"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
ctest --output-on-failure -j "$(nproc)" "$@" | tee "$log" || status=$?

# ctest's summary names each skipped test on a line "<number> - <name> (Skipped)".
mapfile -t gpu_tests < <(ctest -N -L '^cuda$' | sed -n 's/^ *Test *#[0-9]*: //p')
gpu_skipped=() skipped=()
while IFS= read -r name; do
  if printf '%s\n' "${gpu_tests[@]}" | grep -qxF -- "$name"; then
    gpu_skipped+=("$name")
  else
    skipped+=("$name")
  fi
done < <(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$log")
if ((${#gpu_skipped[@]})); then
  echo "test: skipped for want of a GPU (scripts/gpu_verify.sh runs them on one, docs/GPU.md): ${gpu_skipped[*]}"
fi
if ((${#skipped[@]})); then
  echo "test: error: skipped, though set-up installs what they need: ${skipped[*]}" >&2
  exit 1
fi
exit "$status"
