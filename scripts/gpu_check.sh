#!/usr/bin/env bash
# The GPU check in one command: builds what the GPU tests need with the GPU backend and runs
# every one of them (ctest label "cuda": each op against the CPU backend, cuDNN attention
# against the flash kernels, whole training steps against the CPU, two ranks sharing the GPU
# in each kind of parallelism, checkpoints between GPU and CPU, the default job, the GPT-2
# 124M benchmark, the device-buffer communicators), on a GPU machine that has nvcc, cmake and
# ninja but neither Debian's development packages nor a network.
#
# What it needs beside the repository (ignored by git, so brought along explicitly):
#   .gpu-debs/   the libraries' .deb files, from scripts/gpu_fetch_debs.sh on a Debian machine
#   data/kjv/    the default job's corpus, from scripts/prepare_kjv.sh
#   data/gpt2/   GPT-2's tokenizer files, from scripts/setup.sh
# The .debs are unpacked (dpkg -x, or ar and tar where there is no dpkg) into a private prefix,
# never into /. cuDNN, NCCL and NVRTC (which cuDNN's runtime-compiled engines, fused attention
# among them, load when a graph is built) are the CUDA toolkit's when it has them, else those
# of the Python wheels beside PyTorch (nvidia-cudnn-cu13, nvidia-nccl-cu13, nvidia-cuda-nvrtc),
# or where CUDNN_ROOT / NCCL_ROOT / NVRTC_DIR point; NVRTC's folder joins LD_LIBRARY_PATH.
#
# Usage: scripts/gpu_check.sh [DEBS_DIR]    (default: .gpu-debs)
# Environment: TRIDENT_CUDA_ARCHITECTURES (default native: the GPU present), TRIDENT_GPU_WORK
# (default /tmp/trident-gpu: the prefix and the build), TRIDENT_GPU_BUDGET (seconds for the
# whole check, default 570: the device machine allows 600 per command), CUDNN_ROOT,
# NCCL_ROOT, NVRTC_DIR; TRIDENT_GPU_BUILD_ONLY=1 builds the binary alone (no tests, so no
# data/ needed) and stops there (scripts/bench_gpu.sh). Either way $TRIDENT_GPU_WORK/env.sh
# holds the environment the binary runs with (its libraries' folders), for `source`.
#
# Every phase runs under a time limit taken from what is left of the budget. Logs and
# summary.json (the versions found, each phase's outcome and time, each test's result) go to
# $OUT when set (the device tool's output folder), else to the work folder. A GPU test that
# skips (no GPU seen) counts as a failure: this script exists to run them. Exit status 0 when
# everything built and every GPU test ran and passed, 1 when something failed, 2 when
# something it needs is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debs=${1:-$root/.gpu-debs}
work=${TRIDENT_GPU_WORK:-/tmp/trident-gpu}
budget=${TRIDENT_GPU_BUDGET:-570}
prefix=$work/prefix
build=$work/build
logs=${OUT:-$work}
started=$(date +%s)
mkdir -p "$work" "$logs"
exec > >(tee "$logs/gpu_check.log") 2>&1

say() { printf 'gpu_check: %s\n' "$*"; }
left() { echo $((budget - ($(date +%s) - started))); }
# A phase's time limit: at most $1 seconds, and never past the budget.
limit() { local l; l=$(left); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo "$l"; }

# ---- the summary -------------------------------------------------------------------------
declare -A facts=() phases=()
phase_order=()
json_string() {
  local s=$1
  s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/ }; s=${s//$'\r'/}; s=${s//$'\n'/ | }
  printf '"%s"' "$s"
}
write_summary() {  # status
  {
    printf '{\n  "status": %s,\n  "elapsed_s": %d,\n' "$(json_string "$1")" $(($(date +%s) - started))
    printf '  "found": {'
    local first=1 k
    for k in $(printf '%s\n' "${!facts[@]}" | sort); do
      ((first)) || printf ','
      printf '\n    %s: %s' "$(json_string "$k")" "$(json_string "${facts[$k]}")"
      first=0
    done
    printf '\n  },\n  "phases": ['
    first=1
    for k in "${phase_order[@]}"; do
      ((first)) || printf ','
      printf '\n    {"name": %s, %s}' "$(json_string "$k")" "${phases[$k]}"
      first=0
    done
    printf '\n  ],\n  "tests": {'
    first=1
    if [[ -f $work/test_results.txt ]]; then
      while read -r name result; do
        ((first)) || printf ','
        printf '\n    %s: %s' "$(json_string "$name")" "$(json_string "$result")"
        first=0
      done < "$work/test_results.txt"
    fi
    printf '\n  }\n}\n'
  } > "$logs/summary.json"
}
finish() {  # exit code, status
  write_summary "$2"
  say "$2 (summary: $logs/summary.json)"
  exit "$1"
}
# Runs a phase under its limit: name, seconds, log file, command...; records the outcome.
phase() {
  local name=$1 seconds=$2 log=$3
  shift 3
  local t0 status
  t0=$(date +%s)
  phase_order+=("$name")
  say "$name (at most $(limit "$seconds") s)"
  if declare -F "$1" > /dev/null; then  # a function of this script, run in a shell of its own
    timeout --kill-after=10 "$(limit "$seconds")" bash -c "$(declare -f "$1"); $*" > "$log" 2>&1
  else
    timeout --kill-after=10 "$(limit "$seconds")" "$@" > "$log" 2>&1
  fi
  status=$?
  local outcome=passed
  ((status == 124 || status == 137)) && outcome="timed out"
  ((status != 0 && status != 124 && status != 137)) && outcome="failed ($status)"
  phases[$name]="\"outcome\": $(json_string "$outcome"), \"seconds\": $(($(date +%s) - t0))"
  last_outcome=$outcome
  return $status
}
last_outcome=""
rm -f "$work/test_results.txt"

# ---- what this machine has -----------------------------------------------------------------
facts[os]=$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}") || uname -sr)
facts[cpus]=$(nproc)
if command -v nvidia-smi > /dev/null; then
  facts[gpu]=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -4)
  facts[driver]=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)
else
  facts[gpu]="nvidia-smi not found" facts[driver]="unknown"
fi
for tool in nvcc cmake ninja g++ python3 dpkg ar tar; do
  if command -v "$tool" > /dev/null; then
    facts[$tool]="$(command -v "$tool"): $("$tool" --version 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+' || true)"
  else
    facts[$tool]="not found"
  fi
done
for k in os cpus gpu driver nvcc cmake ninja g++ python3 dpkg; do say "$k: ${facts[$k]:-}"; done
missing=()
for tool in nvcc cmake ninja g++ tar; do command -v "$tool" > /dev/null || missing+=("$tool"); done
command -v dpkg > /dev/null || command -v ar > /dev/null || missing+=("dpkg or ar")
((${#missing[@]} == 0)) || { say "missing: ${missing[*]}"; finish 2 "missing tools: ${missing[*]}"; }
ls "$debs"/*.deb > /dev/null 2>&1 ||
  { say "no .deb files in $debs: run scripts/gpu_fetch_debs.sh and bring that folder"; finish 2 "no .debs"; }
build_only=${TRIDENT_GPU_BUILD_ONLY:-0}
data_needed=(data/kjv/gpt2/train.bin data/kjv/gpt2/valid.bin data/gpt2/encoder.json data/gpt2/vocab.bpe)
((build_only)) && data_needed=()
for f in "${data_needed[@]}"; do
  [[ -f $root/$f ]] ||
    { say "$f is missing: the default job's test needs data/kjv (scripts/prepare_kjv.sh) and data/gpt2 (scripts/setup.sh)"; finish 2 "missing $f"; }
done

# ---- the libraries -------------------------------------------------------------------------
rm -rf "$prefix"
mkdir -p "$prefix" "$build"
export root debs prefix build
unpack() {
  local f
  for f in "$debs"/*.deb; do
    if command -v dpkg > /dev/null; then
      dpkg -x "$f" "$prefix" || return 1
    else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$f" && tar -xf data.tar.* -C "$prefix") || { rm -rf "$tmp"; return 1; }
      rm -rf "$tmp"
    fi
  done
}
phase unpack 120 "$work/unpack.log" unpack ||
  { tail -20 "$work/unpack.log"; finish 1 "unpacking the .debs $last_outcome"; }
lib=$prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$lib/openmpi/lib:${LD_LIBRARY_PATH:-}
export PATH=$prefix/usr/bin:$PATH
# Open MPI finds its plugins and help files relative to this prefix instead of /usr.
export OPAL_PREFIX=$prefix/usr
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
cuda_major=$(nvcc --version | sed -nE 's/.*release ([0-9]+)\..*/\1/p')
# Folders where Python's NVIDIA wheels keep their files (nvidia/<name>/{include,lib}).
wheels=$(python3 -c "import nvidia, os; print(os.pathsep.join(nvidia.__path__))" 2>/dev/null || true)
wheel_dirs=()
IFS=: read -r -a wheel_roots <<< "$wheels"
for w in "${wheel_roots[@]}"; do [[ -d $w ]] && wheel_dirs+=("$w"/*); done
# cuDNN and NCCL: a folder holding include/<header> and lib*/<library>.
find_root() {  # header, library name, wheel folder name, variable
  local header=$1 library=$2 wheel=$3 variable=$4 candidates=() dir
  [[ -n ${!variable:-} ]] && candidates+=("${!variable}")
  candidates+=("$cuda_home" /usr/local/cuda /usr)
  for dir in "${wheel_dirs[@]}"; do [[ $(basename "$dir") == "$wheel" ]] && candidates+=("$dir"); done
  for dir in "${candidates[@]}"; do
    if [[ -f $dir/include/$header ]] &&
       { compgen -G "$dir/lib*/$library*" > /dev/null ||
         compgen -G "$dir/lib/x86_64-linux-gnu/$library*" > /dev/null; }; then
      echo "$dir"; return 0
    fi
  done
  return 1
}
cudnn=$(find_root cudnn.h libcudnn.so cudnn CUDNN_ROOT) || { say "cuDNN 9 not found (set CUDNN_ROOT)"; finish 2 "cuDNN not found"; }
nccl=$(find_root nccl.h libnccl.so nccl NCCL_ROOT) || { say "NCCL not found (set NCCL_ROOT)"; finish 2 "NCCL not found"; }
for dir in "$cudnn" "$nccl"; do
  for sub in lib lib64 lib/x86_64-linux-gnu; do [[ -d $dir/$sub ]] && export LD_LIBRARY_PATH=$dir/$sub:$LD_LIBRARY_PATH; done
done
# NVRTC of the toolkit's major version, as cuDNN loads it (libnvrtc.so.<major>).
nvrtc=""
nvrtc_candidates=()
[[ -n ${NVRTC_DIR:-} ]] && nvrtc_candidates+=("$NVRTC_DIR")
nvrtc_candidates+=("$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib")
for dir in "${wheel_dirs[@]}"; do nvrtc_candidates+=("$dir/lib"); done
nvrtc_candidates+=(/usr/lib/x86_64-linux-gnu /usr/lib64)
for dir in "${nvrtc_candidates[@]}"; do
  [[ -e $dir/libnvrtc.so.$cuda_major ]] && { nvrtc=$dir; break; }
done
if [[ -z $nvrtc ]]; then
  found=$(ldconfig -p 2>/dev/null | awk -v n="libnvrtc.so.$cuda_major" '$1 == n {print $NF; exit}')
  [[ -n $found ]] && nvrtc=$(dirname "$found")
fi
[[ -n $nvrtc ]] ||
  { say "libnvrtc.so.$cuda_major not found (set NVRTC_DIR): cuDNN's fused attention cannot build without it"; finish 2 "NVRTC not found"; }
export LD_LIBRARY_PATH=$nvrtc:$LD_LIBRARY_PATH
facts[cudnn_dir]=$cudnn facts[nccl_dir]=$nccl facts[nvrtc_dir]=$nvrtc
export cudnn nccl lib
say "cuDNN from $cudnn, NCCL from $nccl, NVRTC from $nvrtc"
{
  printf 'export LD_LIBRARY_PATH=%q PATH=%q OPAL_PREFIX=%q\n' "$LD_LIBRARY_PATH" "$PATH" "$OPAL_PREFIX"
  printf 'export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none\n'
  printf 'export TRIDENT_CUDNN_DIR=%q\n' "$cudnn"
} > "$work/env.sh"

# ---- build: the binary and the GPU tests only -------------------------------------------------
configure() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${TRIDENT_CUDA_ARCHITECTURES:-native}" \
    -DCUDNN_ROOT="$cudnn" -DNCCL_ROOT="$nccl" \
    -DCMAKE_PREFIX_PATH="$prefix/usr" -DICU_ROOT="$prefix/usr" \
    -DOPENBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread" \
    -DOPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so" \
    -DMPI_C_COMPILER=/nonexistent -DMPI_CXX_COMPILER=/nonexistent \
    -DMPI_CXX_HEADER_DIR="$lib/openmpi/include" -DMPI_CXX_LIB_NAMES=mpi \
    -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/orterun"
}
phase configure 120 "$logs/configure.log" configure ||
  { tail -30 "$logs/configure.log"; finish 1 "configure $last_outcome (configure.log)"; }
targets=(trident trident_cuda_tests trident_cuda_comm_tests)
((build_only)) && targets=(trident)
phase build 330 "$logs/build.log" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" ||
  { grep -E "error|FAILED" "$logs/build.log" | head -40; finish 1 "build $last_outcome (build.log)"; }
((build_only)) && finish 0 "built $build/trident (environment: $work/env.sh)"

# The versions the binary runs with, as the GPU tests' runner prints them.
phase versions 60 "$work/versions.log" "$build/tests/cuda/trident_cuda_tests" --list-test-names-only
facts[gpu_seen]=$(sed -n 's/^GPU: //p' "$work/versions.log" | head -1)
facts[libraries]=$(sed -n 's/^GPU libraries: //p' "$work/versions.log" | head -1)
say "GPU: ${facts[gpu_seen]:-none seen}"
say "libraries: ${facts[libraries]:-unknown}"

# ---- tests ---------------------------------------------------------------------------------
expected=$(cd "$build" && ctest -L cuda -N | sed -nE 's/^Total Tests: ([0-9]+)/\1/p')
# Each test's own limit leaves the rest of the budget to the others; the phase stops at the
# budget.
per_test=$(($(left) - 20))
((per_test > 300)) && per_test=300
phase tests "$(($(left) - 15))" "$logs/ctest.log" \
  bash -c "cd '$build' && ctest -L cuda --output-on-failure --timeout $per_test -j 1"
status=$?
# ctest's own record of every test's output (the attention choices, the versions) comes too.
[[ -f $build/Testing/Temporary/LastTest.log ]] && tail -c 15M "$build/Testing/Temporary/LastTest.log" > "$logs/tests_output.log"
sed -nE 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *(\*\*\*)?([A-Za-z]+( [A-Za-z]+)*).*/\1 \3/p' \
  "$logs/ctest.log" > "$work/test_results.txt"
ran=$(wc -l < "$work/test_results.txt")
passed=$(grep -c " Passed$" "$work/test_results.txt")
skipped=$(grep -c " Skipped$" "$work/test_results.txt")
facts[tests]="$passed of ${expected:-?} passed, $skipped skipped, $ran reported"
say "${facts[tests]}"
((status == 124 || status == 137)) && finish 1 "the tests ran past the budget (ctest.log)"
((ran == 0)) && finish 1 "no GPU test ran (ctest.log)"
((skipped > 0)) && finish 1 "$skipped GPU tests were skipped: no GPU seen? (ctest.log)"
[[ -n $expected && $passed -ne $expected ]] && finish 1 "GPU tests failed (ctest.log, tests_output.log)"
((status != 0)) && finish 1 "GPU tests failed (ctest.log)"
finish 0 "all $passed GPU tests passed"
