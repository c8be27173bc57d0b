#!/usr/bin/env bash
# The GPU check in one command: builds what the GPU tests need with the GPU backend and runs
# them (ctest label "cuda": each op against the CPU backend, cuDNN attention against the flash
# kernels, whole training steps against the CPU, two ranks sharing the GPU in each kind of
# parallelism, checkpoints between GPU and CPU, the default job, the GPT-2 124M benchmark, the
# device-buffer communicators), on a GPU machine that has nvcc, cmake and ninja but neither
# Debian's development packages nor a network. docs/GPU.md gives the device calls that run it.
#
# What it needs beside the repository (ignored by git, so brought along explicitly):
#   .gpu-debs/   the libraries' .deb files, from scripts/gpu_fetch_debs.sh on a Debian machine
#   data/kjv/    the default job's corpus, from scripts/prepare_kjv.sh
#   data/gpt2/   GPT-2's tokenizer files, from scripts/setup.sh
# The .debs are unpacked (dpkg -x, or ar and tar where there is no dpkg) into a private prefix,
# never into /. cuDNN, NCCL and NVRTC are found by scripts/gpu_libs.sh: the CUDA toolkit's, or
# those of the Python wheels beside PyTorch, or where CUDNN_ROOT / NCCL_ROOT / NVRTC_DIR point.
#
# The unpacked Debian libraries and programs go first on LD_LIBRARY_PATH and PATH for
# Trident's own processes only (its configure, its tests and the binary), never for this
# script, Python or other programs: they run through $TRIDENT_GPU_WORK/trident-env, which
# sets them for its command; $TRIDENT_GPU_WORK/env.sh names it (TRIDENT_ENV) and the folders
# of cuDNN, NCCL and NVRTC, which any CUDA program may take (TRIDENT_GPU_LIBS), for `source`.
# Open MPI and its PMIx find their plugins and help files under the prefix (OPAL_PREFIX,
# PMIX_PREFIX: without it PMIx prints a help-file warning at every MPI_Init).
#
# Usage: scripts/gpu_check.sh [DEBS_DIR]    (default: .gpu-debs)
# Environment: TRIDENT_GPU_TESTS (a regular expression on the test names, e.g.
# 'cuda\.(ops|ring|attention)': those alone; default every GPU test), TRIDENT_GPU_BUDGET
# (seconds for the whole check, default 570: the device machine allows 600 per command),
# TRIDENT_CUDA_ARCHITECTURES (default native: the GPU present), TRIDENT_GPU_WORK (default
# .gpu-work/check: the prefix and the build, where a later call on the same machine finds
# them), CUDNN_ROOT, NCCL_ROOT, NVRTC_DIR; TRIDENT_GPU_BUILD_ONLY=1 builds the binary alone
# (no tests, so no data/ needed) and stops there (scripts/bench_gpu.sh).
#
# Every phase runs under a time limit taken from what is left of the budget, each test under
# its own, so that a test that hangs costs its own limit and the later tests still run. What
# comes back ($OUT when set, the device tool's output folder, else the work folder) is three
# files: gpu_check.log (this output), summary.json (the versions found, each phase's outcome
# and time, each test's result and every named skip) and gpu_check_logs.tar.gz (configure,
# build, every test's output). A GPU test that skips (no GPU seen) counts as a failure: this
# script exists to run them; a test case that cannot run on one GPU says so in a line
# "SKIPPED: ..." and is listed. Exit status 0 when everything built and every GPU test ran and
# passed, 1 when something failed, 2 when something it needs is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debs=${1:-$root/.gpu-debs}
work=${TRIDENT_GPU_WORK:-$root/.gpu-work/check}
budget=${TRIDENT_GPU_BUDGET:-570}
selected=${TRIDENT_GPU_TESTS:-}
build_only=${TRIDENT_GPU_BUILD_ONLY:-0}
prefix=$work/prefix
build=$work/build
logs=$work/logs
out=${OUT:-$work}
started=$(date +%s)
rm -rf "$logs"
mkdir -p "$work" "$logs" "$out"
exec > >(tee "$out/gpu_check.log") 2>&1

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
json_object_of_lines() {  # file of "key value" lines -> {"key": "value", ...}
  local first=1 key value
  printf '{'
  if [[ -f $1 ]]; then
    while read -r key value; do
      ((first)) || printf ','
      printf '\n    %s: %s' "$(json_string "$key")" "$(json_string "$value")"
      first=0
    done < "$1"
  fi
  printf '\n  }'
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
    printf '\n  ],\n  "tests": %s,\n' "$(json_object_of_lines "$work/test_results.txt")"
    printf '  "named_skips": %s\n}\n' "$(json_object_of_lines "$work/named_skips.txt")"
  } > "$out/summary.json"
}
finish() {  # exit code, status
  write_summary "$2"
  tar -czf "$out/gpu_check_logs.tar.gz" -C "$work" logs 2> /dev/null
  say "$2 (summary: $out/summary.json; logs: $out/gpu_check_logs.tar.gz)"
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
rm -f "$work/test_results.txt" "$work/named_skips.txt"

# ---- what this machine has -----------------------------------------------------------------
facts[os]=$( (. /etc/os-release 2>/dev/null && echo "${PRETTY_NAME:-unknown}") || uname -sr)
facts[cpus]=$(nproc)
if command -v nvidia-smi > /dev/null; then
  facts[gpu]=$(nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader 2>&1 | head -4)
  facts[driver]=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>&1 | head -1)
else
  facts[gpu]="nvidia-smi not found" facts[driver]="unknown"
fi
for tool in nvcc cmake ninja g++ python3 dpkg ar tar make; do
  if command -v "$tool" > /dev/null; then
    facts[$tool]="$(command -v "$tool"): $("$tool" --version 2>&1 | grep -m1 -E '[0-9]+\.[0-9]+' || true)"
  else
    facts[$tool]="not found"
  fi
done
missing=()
for tool in nvcc cmake ninja g++ tar; do command -v "$tool" > /dev/null || missing+=("$tool"); done
command -v dpkg > /dev/null || command -v ar > /dev/null || missing+=("dpkg or ar")
if ((${#missing[@]})); then
  for k in os gpu driver nvcc cmake ninja g++; do say "$k: ${facts[$k]:-}"; done
  say "missing: ${missing[*]}"
  finish 2 "missing tools: ${missing[*]}"
fi
cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
# The toolkit's own cuBLASLt and NVRTC (what the binary links, and what cuDNN loads).
facts[toolkit_cublaslt]=$(compgen -G "$cuda_home/lib*/libcublasLt.so.*" | sort | tail -1)
facts[toolkit_nvrtc]=$(compgen -G "$cuda_home/lib*/libnvrtc.so.*" | sort | tail -1)
for k in os cpus gpu driver nvcc cmake ninja g++ python3 dpkg make toolkit_cublaslt toolkit_nvrtc; do
  say "$k: ${facts[$k]:-none}"
done
ls "$debs"/*.deb > /dev/null 2>&1 ||
  { say "no .deb files in $debs: run scripts/gpu_fetch_debs.sh and bring that folder"; finish 2 "no .debs"; }
data_needed=(data/kjv/gpt2/train.bin data/kjv/gpt2/valid.bin data/gpt2/encoder.json data/gpt2/vocab.bpe)
((build_only)) && data_needed=()
for f in "${data_needed[@]}"; do
  [[ -f $root/$f ]] ||
    { say "$f is missing: the default job's test needs data/kjv (scripts/prepare_kjv.sh) and data/gpt2 (scripts/setup.sh)"; finish 2 "missing $f"; }
done

# ---- the libraries -------------------------------------------------------------------------
# Unpacked once per set of .debs: a later call on the same machine finds them.
stamp=$(cd "$debs" && ls -l -- *.deb | md5sum | cut -d' ' -f1)
unpack() {
  local f
  rm -rf "$prefix"
  mkdir -p "$prefix"
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
  echo "$stamp" > "$prefix/.stamp"
}
export debs prefix stamp
if [[ $(cat "$prefix/.stamp" 2>/dev/null) != "$stamp" ]]; then
  phase unpack 120 "$logs/unpack.log" unpack ||
    { tail -20 "$logs/unpack.log"; finish 1 "unpacking the .debs $last_outcome"; }
fi
lib=$prefix/usr/lib/x86_64-linux-gnu

# shellcheck source=scripts/gpu_libs.sh
source "$root/scripts/gpu_libs.sh"
find_gpu_libs || { say "not found: $gpu_libs_missing"; finish 2 "not found: $gpu_libs_missing"; }
facts[cudnn_dir]=$cudnn facts[nccl_dir]=$nccl facts[nvrtc_dir]=$nvrtc
say "cuDNN from $cudnn, NCCL from $nccl, NVRTC from $nvrtc"
# The wrapper of Trident's processes, and what other programs may take.
trident_env=$work/trident-env
{
  echo '#!/usr/bin/env bash'
  echo "# Runs its arguments with the unpacked Debian libraries and programs first, as Trident's"
  echo "# processes run (written by scripts/gpu_check.sh)."
  printf 'exec env LD_LIBRARY_PATH=%q PATH=%q \\\n' \
    "$gpu_lib_path:$lib:$lib/openblas-pthread:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$prefix/usr/bin:$PATH"
  printf '  OPAL_PREFIX=%q PMIX_PREFIX=%q \\\n' "$prefix/usr" "$lib/pmix2"
  printf '  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\\n'
  printf '  OMPI_MCA_btl_vader_single_copy_mechanism=none "$@"\n'
} > "$trident_env"
chmod +x "$trident_env"
{
  echo "# For scripts on this machine (written by scripts/gpu_check.sh): TRIDENT_ENV runs a command"
  echo "# as Trident's processes run; TRIDENT_GPU_LIBS, the folders of cuDNN, NCCL and NVRTC, any"
  echo "# CUDA program may take."
  printf 'TRIDENT_ENV=%q\nTRIDENT_GPU_LIBS=%q\n' "$trident_env" "$gpu_lib_path"
} > "$work/env.sh"

# ---- build: the binary and the GPU tests only -------------------------------------------------
# Configured under trident_env: the tests' CMake runs Open MPI's launcher for its version.
configure() {
  "$trident_env" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${TRIDENT_CUDA_ARCHITECTURES:-native}" \
    -DCUDNN_ROOT="$cudnn" -DNCCL_ROOT="$nccl" \
    -DCMAKE_PREFIX_PATH="$prefix/usr" -DICU_ROOT="$prefix/usr" \
    -DOPENBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread" \
    -DOPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so" \
    -DMPI_C_COMPILER=/nonexistent -DMPI_CXX_COMPILER=/nonexistent \
    -DMPI_CXX_HEADER_DIR="$lib/openmpi/include" -DMPI_CXX_LIB_NAMES=mpi \
    -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/orterun"
}
export root build cudnn nccl lib trident_env
phase configure 120 "$logs/configure.log" configure ||
  { tail -30 "$logs/configure.log"; finish 1 "configure $last_outcome (configure.log)"; }
targets=(trident trident_cuda_tests trident_cuda_comm_tests)
((build_only)) && targets=(trident)
# The build may take all but a minute of what is left: the tests cannot run without it, and
# those it leaves no time for are reported as not run.
phase build $(($(left) - 60)) "$logs/build.log" cmake --build "$build" -j "$(nproc)" \
  --target "${targets[@]}" ||
  { grep -E "error|FAILED" "$logs/build.log" | head -40; finish 1 "build $last_outcome (build.log)"; }
((build_only)) && finish 0 "built $build/trident (environment: $work/env.sh)"

# The versions the binary runs with, as the GPU tests' runner prints them.
phase versions 60 "$logs/versions.log" "$trident_env" "$build/tests/cuda/trident_cuda_tests" \
  --list-test-names-only
facts[gpu_seen]=$(sed -n 's/^GPU: //p' "$logs/versions.log" | head -1)
facts[libraries]=$(sed -n 's/^GPU libraries: //p' "$logs/versions.log" | head -1)
say "GPU: ${facts[gpu_seen]:-none seen}"
say "libraries: ${facts[libraries]:-unknown}"

# ---- tests, one at a time, each under its own limit ------------------------------------------
# Each test's limit: what it should take on an H100 with room to spare (seconds), never past
# what is left. A test not in the table gets 300.
declare -A cap=([cuda.ops]=180 [cuda.ring]=120 [cuda.attention]=120 [cuda.step]=240
                [cuda.cli]=240 [cuda.layouts]=300 [cuda.checkpoint]=180 [cuda.default-job]=240
                [cuda.bench]=180 [cuda.comm.np2]=120)
mapfile -t tests < <(cd "$build" && ctest -N -L cuda | sed -n 's/^ *Test *#[0-9]*: //p' |
                     grep -E -- "${selected:-.}")
((${#tests[@]})) || finish 1 "no GPU test matches '$selected'"
say "tests: ${tests[*]}"
phase_order+=(tests)
t0=$(date +%s)
failed=0 passed=0
for name in "${tests[@]}"; do
  seconds=$(limit "${cap[$name]:-300}")
  if (($(left) < 30)); then
    echo "$name not run (budget)" >> "$work/test_results.txt"
    failed=$((failed + 1))
    continue
  fi
  say "$name (at most $seconds s)"
  log=$logs/$name.log
  # -V: every test's whole output, its named skips and the attention's choices included.
  (cd "$build" && timeout --kill-after=10 $((seconds + 30)) "$trident_env" ctest -V \
     -R "^${name//./\\.}\$" --timeout "$seconds" > "$log" 2>&1)
  # ctest counts a skipped test among the passed ones: its "(Skipped)" line comes first here.
  result=failed
  if grep -q '(Skipped)\|Not Run' "$log"; then
    result="skipped: no GPU seen?"
  elif grep -q '(Timeout)' "$log"; then
    result="timed out after $seconds s"
  elif grep -qE '100% tests passed, 0 tests failed' "$log"; then
    result=passed
  fi
  if [[ $result == passed ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  say "$name: $result"
  echo "$name $result" >> "$work/test_results.txt"
  # What a test could not do on this machine, in its own words ("SKIPPED: ...").
  grep -ho 'SKIPPED: .*' "$log" | sort -u | sed "s/^/$name /" >> "$work/named_skips.txt"
done
phases[tests]="\"outcome\": $(json_string "$passed passed, $failed not"), \"seconds\": $(($(date +%s) - t0))"
facts[tests]="$passed of ${#tests[@]} passed"
[[ -s $work/named_skips.txt ]] && say "named skips:" && sed 's/^/  /' "$work/named_skips.txt"
((failed == 0)) || finish 1 "$failed of ${#tests[@]} GPU tests did not pass (gpu_check_logs.tar.gz)"
finish 0 "all $passed GPU tests passed"
