#!/usr/bin/env bash
# The GPU check in one command on a GPU machine that compiles nothing (docs/GPU.md): unpacks
# .gpu-bundle/bundle.tar.xz (scripts/gpu_bundle.sh), finds the CUDA libraries of the machine
# (scripts/gpu_libs.sh) and runs the phases below in order of importance, each under its own
# limit and never past the budget, so that a phase that hangs costs its own limit and those
# after it still run:
#   env         the GPU, driver, compute mode, the libraries the binaries resolve
#   ops         every CUDA op against the CPU backend, fp32 and 16-bit   ([ops] of the tests)
#   attention   cuDNN fused attention against the flash kernels          ([attention])
#   ring        ring attention's blocks, strided copies                  ([ring])
#   step        whole training steps against the CPU, GPT-2 and llama    ([step])
#   expected    the default job's 20 steps, GPT-2 and llama, against the CPU losses computed
#               where the bundle was built (scripts/gpu_expected_losses.sh)
#   cli         `trident train` on the GPU against the CPU, one and two ranks ([cli])
#   layouts     two ranks sharing the GPU in each layout against one     ([layouts])
#   checkpoint  GPU to CPU and back                                      ([checkpoint])
#   offload     host and NVMe offload against none                      ([offload])
#   comm        the device-buffer communicators under mpirun             (two ranks)
#   speed-124m  GPT-2 124M bf16: Trident, PyTorch (eager, compiled), llm.c (scripts/bench_gpu.sh)
#   default-job configs/default.yaml on the GPU                          ([default-job])
#   speed-350m  GPT-2 350M: Trident, PyTorch compiled, llm.c
#   speed-1.5b  GPT-2 1.5B: Trident alone (MFU)
# and, only when named in TRIDENT_VERIFY_PHASES, profile-124m and profile-1.5b (GPT-2 1.5B's
# width with 4 of its layers): every kernel of a step timed under Nsight Compute.
# After every phase it rewrites $OUT/summary.json (the facts found, each phase's outcome, time
# and figures: the worst relative error of each compared tensor, the worst loss differences,
# tokens/s) and $OUT/gpu_verify_logs.tar.gz, so a later phase cut off loses nothing earlier.
#
# Nothing is installed or linked outside the tree: the bundle unpacks under .gpu-work, the test
# binaries take this tree, the bundle's trident and its Open MPI launcher from TRIDENT_TEST_*
# variables, and Trident's processes run through a wrapper (trident-env) that puts the bundle's
# libraries first for them alone.
#
# Usage: scripts/gpu_verify.sh [--dry-run]
#   --dry-run  without a GPU: unpacks, checks the manifest and the libraries, then walks every
#              phase printing its command and checking that each file it names exists
# Environment: TRIDENT_VERIFY_BUDGET (seconds for everything, default 450), TRIDENT_VERIFY_PHASES
# (the phases to run, e.g. "env step cli": a second call after a fix; default all),
# TRIDENT_BUNDLE (default .gpu-bundle/bundle.tar.xz; .gpu-bundle/update.tar.xz, when present, is
# unpacked over it: scripts/gpu_bundle.sh --update), TRIDENT_VERIFY_WORK (default
# .gpu-work/verify). Exit status 0 when every phase run passed, 1 otherwise, 2 when the bundle
# or a library is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${TRIDENT_BUNDLE:-$root/.gpu-bundle/bundle.tar.xz}
update=$(dirname "$bundle")/update.tar.xz
work=${TRIDENT_VERIFY_WORK:-$root/.gpu-work/verify}
out=${OUT:-$work/out}
budget=${TRIDENT_VERIFY_BUDGET:-450}
wanted=${TRIDENT_VERIFY_PHASES:-all}
dry_run=0
[[ ${1:-} == --dry-run ]] && dry_run=1
started=$(date +%s)
logs=$work/logs
b=$work/bundle
rm -rf "$logs" "$work/records"
mkdir -p "$logs" "$out" "$work/records"
exec > >(tee "$out/gpu_verify.log") 2>&1

say() { printf 'gpu_verify: %s\n' "$*"; }
left() { echo $((budget - ($(date +%s) - started))); }
limit() { local l; l=$(left); ((l > $1)) && l=$1; echo "$l"; }
fact() { printf '%s\t%s\n' "$1" "$2" >> "$work/records/facts.tsv"; }
# summary.json and the log tarball, rewritten after every phase.
write_summary() {
  python3 "$root/scripts/gpu_verify_summary.py" "$work/records" "$logs" "$1" \
    $(($(date +%s) - started)) > "$out/summary.json.new" && mv "$out/summary.json.new" "$out/summary.json"
  tar -czf "$out/gpu_verify_logs.tar.gz" -C "$work" logs 2> /dev/null
}
finish() {  # exit code, status
  write_summary "$2"
  say "$2 (summary: $out/summary.json; logs: $out/gpu_verify_logs.tar.gz)"
  exit "$1"
}
# "all" is every phase but the profiles, which run when named.
selected() { [[ " $wanted " == *" $1 "* || ($wanted == all && $1 != profile-*) ]]; }

# Runs one phase: name, seconds at most, command...; its output goes to logs/<name>.log.
failures=0
phase() {
  local name=$1 cap=$2 seconds t0 status outcome
  shift 2
  selected "$name" || return 0
  seconds=$(limit "$cap")
  if ((seconds < 15)); then
    printf '%s\t%s\t0\n' "$name" "not run: budget spent" >> "$work/records/phases.tsv"
    failures=$((failures + 1))
    say "$name: not run (budget spent)"
    return 1
  fi
  say "$name (at most $seconds s)"
  export phase_seconds=$seconds
  t0=$(date +%s)
  if ((dry_run)); then
    dry_check "$@" > "$logs/$name.log" 2>&1
  else
    timeout --kill-after=5 "$seconds" bash -c '"$@"' _ "$@" > "$logs/$name.log" 2>&1
  fi
  status=$?
  outcome=passed
  ((status == 124 || status == 137)) && outcome="timed out after $seconds s"
  ((status == 77)) && outcome="skipped: no GPU seen"
  ((status != 0 && status != 77 && status != 124 && status != 137)) && outcome="failed ($status)"
  printf '%s\t%s\t%d\n' "$name" "$outcome" $(($(date +%s) - t0)) >> "$work/records/phases.tsv"
  say "$name: $outcome in $(($(date +%s) - t0)) s"
  grep -h 'SKIPPED: ' "$logs/$name.log" | sort -u | sed 's/^/  /'
  if [[ $outcome != passed ]]; then
    failures=$((failures + 1))
    grep -E -A3 'FAILED|REQUIRE|CHECK\(|error|Error' "$logs/$name.log" | head -30 | sed 's/^/  | /'
  fi
  write_summary "running"
  [[ $outcome == passed ]]
}
# --dry-run: the command's programs and the files it names must exist.
dry_check() {
  local a
  echo "would run: $*"
  for a in "$@"; do
    [[ $a == /* && ! -e $a ]] && { echo "missing: $a"; return 1; }
  done
  command -v "$1" > /dev/null || { echo "not found: $1"; return 1; }
}

# ---- the bundle ----------------------------------------------------------------------------
[[ -f $bundle ]] || { say "$bundle is missing: run scripts/gpu_bundle.sh and carry .gpu-bundle"; finish 2 "no bundle"; }
rm -rf "$b"
tar -xJf "$bundle" -C "$work" || finish 2 "cannot unpack $bundle"
manifest=$b/MANIFEST
field() { sed -n "s/^$1 //p" "$manifest" | head -1; }
(cd "$b" && sed -n '/^files$/,$p' MANIFEST | tail -n +2 | awk '{print $2 "  " $3}' |
   sha256sum --quiet -c -) || finish 2 "the bundle does not match its MANIFEST"
if [[ -f $update ]]; then  # binaries rebuilt after the bundle (scripts/gpu_bundle.sh --update)
  tar -xJf "$update" -C "$work" && (cd "$b" && sha256sum --quiet -c UPDATE) ||
    finish 2 "$update does not unpack or match its UPDATE"
  fact update "$(awk '{print $2}' "$b/UPDATE" | tr '\n' ' ')"
  say "update: $(awk '{print $2}' "$b/UPDATE" | tr '\n' ' ')"
fi
fact bundle "$(field commit); $(field built)"
say "bundle: $(field commit), $(field built)"

# ---- the CUDA libraries of this machine, and the environment of Trident's processes ----------
export PATH=$PATH:/usr/local/cuda/bin
# shellcheck source=scripts/gpu_libs.sh
source "$root/scripts/gpu_libs.sh"
if ! find_gpu_libs; then
  say "not found: $gpu_libs_missing"
  ((dry_run)) || finish 2 "not found: $gpu_libs_missing"
  gpu_lib_path=""
fi
fact cuda_home "${cuda_home:-none}"
fact libraries "cuDNN ${cudnn:-?}; NCCL ${nccl:-?}; NVRTC ${nvrtc:-?}"
ompi=$b/prefix/usr
trident_env=$work/trident-env
{
  echo '#!/usr/bin/env bash'
  echo '# Runs its arguments as Trident'"'"'s processes run (written by scripts/gpu_verify.sh).'
  printf 'exec env LD_LIBRARY_PATH=%q PATH=%q \\\n' \
    "${gpu_lib_path:+$gpu_lib_path:}${cuda_home:+$cuda_home/lib64:}$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$ompi/bin:$PATH"
  printf '  OPAL_PREFIX=%q PMIX_PREFIX=%q \\\n' "$ompi" "$ompi/lib/x86_64-linux-gnu/pmix2"
  printf '  OMPI_MCA_mca_base_component_path=%q \\\n' "$ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"
  printf '  PMIX_MCA_mca_base_component_path=%q \\\n' "$ompi/lib/x86_64-linux-gnu/pmix2/lib/pmix"
  printf '  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\\n'
  printf '  OMPI_MCA_btl_vader_single_copy_mechanism=none CUDNN_LOGLEVEL_DBG=2 \\\n'
  printf '  CUDNN_LOGDEST_DBG=%q "$@"\n' "$logs/cudnn.log"
} > "$trident_env"
chmod +x "$trident_env"

# The test binaries find the tree (configs/, data/), the binary and the launcher through
# variables, in place of the paths compiled in where they were built; the data the checks read
# comes with the bundle when the tree has none.
for f in data/gpt2/encoder.json data/gpt2/vocab.bpe data/kjv/gpt2/train.bin data/kjv/gpt2/valid.bin; do
  [[ -f $root/$f ]] || { mkdir -p "$(dirname "$root/$f")" && cp "$b/$f" "$root/$f"; } ||
    finish 2 "$f: neither in the tree nor in the bundle"
done
export TRIDENT_TEST_SOURCE_DIR=$root TRIDENT_TEST_BINARY=$b/bin/trident
export TRIDENT_TEST_MPIEXEC="$ompi/bin/orterun --oversubscribe"
fact paths "tree $root; binary $TRIDENT_TEST_BINARY; launcher $TRIDENT_TEST_MPIEXEC"

# ---- the phases ----------------------------------------------------------------------------
tests=$b/bin/trident_cuda_tests
environment() {
  nvidia-smi --query-gpu=name,memory.total,compute_cap,compute_mode,driver_version,clocks.max.sm \
    --format=csv
  nvidia-smi
  local f unresolved=0
  for f in "$b"/bin/* "$ompi"/bin/orterun; do
    echo "== ldd $f"
    "$trident_env" ldd "$f" | tee "$work/ldd.txt"
    grep -q 'not found' "$work/ldd.txt" && unresolved=1
  done
  "$trident_env" "$tests" --list-test-names-only > "$work/list.txt"
  head -3 "$work/list.txt"
  grep -q '^GPU: ' "$work/list.txt" && ((unresolved == 0))
}
catch() { "$trident_env" "$tests" "[$1]" --durations yes; }
# The default job's 20 steps on the GPU against the CPU losses computed where the bundle was built.
expected() {
  cd "$root" && TRIDENT_CHECK_DATA=$b/data/kjv/gpt2 scripts/gpu_expected_losses.sh check \
    "$b/bin/trident" "$b/expected" "$trident_env"
}
# Speed: scripts/bench_gpu.sh with the bundle's binaries; its rows accumulate in $out.
bench() {  # models, trainers
  BENCH_MODELS=$1 BENCH_TRAINERS=$2 TRIDENT_ENV=$trident_env TRIDENT_BIN=$b/bin/trident \
    LLMC_BIN=$b/bin/train_gpt2cu BENCH_RESULTS=$out/bench_gpu.jsonl TRIDENT_BENCH_BUDGET=$((phase_seconds - 5)) \
    TRIDENT_GPU_WORK=$work/bench OUT=$work/bench/out "$root/scripts/bench_gpu.sh"
  local status=$?
  cp "$work/bench/out/bench_gpu.jsonl" "$work/bench/out/bench_gpu.md" "$logs/" 2> /dev/null
  cp "$work/bench/out/bench_gpu.jsonl" "$out/bench_gpu.jsonl" 2> /dev/null
  tar -xzf "$work/bench/out/bench_logs.tar.gz" -C "$logs" 2> /dev/null
  return $status
}
# Where a step's time goes: every kernel of a warm-up and a timed step of one micro batch under
# Nsight Compute, its duration alone (one pass), summed by kernel (scripts/kernel_times.py).
profile() {  # layers hidden heads micro_batch recompute name
  local ncu
  ncu=$(command -v ncu || compgen -G "/opt/nvidia/nsight-compute/*/ncu" | sort | tail -1)
  [[ -n $ncu ]] || { echo "ncu not found"; return 2; }
  "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "$trident_env" "$b/bin/trident" bench --config "$root/configs/gpt2-124m.yaml" \
    --set device=cuda --set model.layers="$1" --set model.hidden="$2" --set model.heads="$3" \
    --set model.ffn_hidden=$((4 * $2)) --set training.micro_batch="$4" \
    --set training.global_batch="$4" --set training.recompute="$5" --steps 1 --warmup 1 \
    > "$logs/profile-$6.csv" &&
    python3 "$root/scripts/kernel_times.py" "$logs/profile-$6.csv" 30
}
# The phases run in a shell of their own under `timeout`: what they use goes with them.
export -f environment catch expected bench profile
export trident_env tests b ompi work logs out root
phase env 30 environment
fact gpu "$(sed -n 2p "$logs/env.log" 2> /dev/null)"
fact gpu_seen "$(sed -n 's/^GPU: //p' "$logs/env.log" | head -1)"
fact gpu_libraries "$(sed -n 's/^GPU libraries: //p' "$logs/env.log" | head -1)"
say "GPU: $(sed -n 's/^GPU: //p' "$logs/env.log" | head -1)"
say "libraries: $(sed -n 's/^GPU libraries: //p' "$logs/env.log" | head -1)"

phase ops 75 catch ops
phase attention 45 catch attention
phase ring 30 catch ring
phase step 75 catch step
phase expected 45 expected
phase cli 60 catch cli
phase layouts 90 catch layouts
phase checkpoint 45 catch checkpoint
phase offload 45 catch offload
phase comm 30 "$trident_env" $TRIDENT_TEST_MPIEXEC -n 2 "$b/bin/trident_cuda_comm_tests"

phase speed-124m 150 bench 124m "trident pytorch-eager pytorch llmc"
phase default-job 60 catch default-job
phase speed-350m 120 bench 350m "trident pytorch llmc"
phase speed-1.5b 90 bench 1.5b trident
phase profile-124m 120 profile 12 768 12 16 none 124m
phase profile-1.5b 150 profile 4 1600 25 4 selective 1.5b

((failures == 0)) || finish 1 "$failures phase(s) did not pass"
finish 0 "every phase passed"
