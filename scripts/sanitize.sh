#!/usr/bin/env bash
# The sanitizer check (run by CI after scripts/test.sh): Trident built with AddressSanitizer and
# UndefinedBehaviorSanitizer into build-asan/ (CPU only, -O1 with debug lines, a finding ends
# the process), then
#   1. the unit and command-line tests (the Catch2 binary, every case but the hidden ones and
#      the layout search at the papers' scale, [papers]: the same code as the small [search]
#      cases, over hundreds of thousands of layouts, minutes under the sanitizers),
#   2. the parsers' fuzz tests again, with TRIDENT_FUZZ_ITERATIONS mutated inputs each,
#   3. one small layout under mpirun: 2 x 1 x 1 (2 ranks: the pipeline executor's sends and
#      receives, the watchdog thread, the embedding's tied-weight reduction) trains as one
#      process does, to 1e-5.
# Any sanitizer report, or any failure, fails the script; it prints the time each part took.
# Usage: scripts/sanitize.sh [BUILD_DIR]   (default build-asan; TRIDENT_FUZZ_ITERATIONS,
#        default 5000)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-asan}
fuzz_iterations=${TRIDENT_FUZZ_ITERATIONS:-5000}
started=$SECONDS
lap() { echo "sanitize: $1 in $((SECONDS - started)) s"; started=$SECONDS; }

# For the baseline x86-64, not -march=native or the default x86-64-v3: GCC may store vector
# registers to stack slots aligned to their width, and ASan's fake stack frames
# (detect_stack_use_after_return) do not keep that alignment (seen with AVX-512's 64 bytes), so
# the aligned store faults in code that is correct. The sanitizers check memory, not speed.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DTRIDENT_CUDA=OFF -DTRIDENT_NATIVE=OFF -DTRIDENT_CPU_ARCH=x86-64 \
  -DTRIDENT_SANITIZE=address,undefined >/dev/null
cmake --build "$build" --target trident trident_tests -j "$(nproc)"
lap "built $build"

# Leak checking stays on for the unit tests' own process; the trident binary turns it off for
# itself (Open MPI's allocations at MPI_Init are never freed: src/main.cpp says why).
export ASAN_OPTIONS="abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

"$build/tests/trident_tests" -w NoTests "~[fuzz]~[papers]"
lap "unit and command-line tests passed"

TRIDENT_FUZZ_ITERATIONS=$fuzz_iterations "$build/tests/trident_tests" -w NoTests "[fuzz]"
lap "fuzz tests passed ($fuzz_iterations inputs per parser)"

# The layout: a tiny model, 3 steps, one process against 2 x 1 x 1.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'EOF'
import struct, sys
d = sys.argv[1]
tokens = [(i * 7919 + (i * i) % 101) % 300 for i in range(3000)]
with open(f"{d}/train.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
with open(f"{d}/c.yaml", "w") as f:
    f.write("model: {vocab_size: 300, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: 128}\n"
            "training: {micro_batch: 1, global_batch: 4, steps: 3, warmup_steps: 1, threads: 1}\n"
            f"data: {{train: {d}/train.bin, shuffle: false}}\n")
EOF
"$build/trident" train --config "$work/c.yaml" --set "logging.metrics=$work/one.jsonl" >/dev/null
mpirun --oversubscribe -np 2 "$build/trident" train --config "$work/c.yaml" \
  --set parallel.pipeline=2 --set "logging.metrics=$work/grid.jsonl" >/dev/null
python3 - "$work" <<'EOF'
import json, sys
d = sys.argv[1]
one, grid = ([json.loads(l)["loss"] for l in open(f"{d}/{n}.jsonl")] for n in ("one", "grid"))
if len(one) != 3 or len(grid) != 3 or any(abs(a - b) > 1e-5 * abs(b) for a, b in zip(grid, one)):
    sys.exit(f"sanitize: 2 x 1 x 1 gave {grid}, one process {one}")
EOF
lap "2 x 1 x 1 under mpirun trains as one process"
echo "sanitize: clean"
