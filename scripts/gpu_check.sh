#!/usr/bin/env bash
# Builds Trident with the GPU backend and runs every GPU test (ctest label "cuda": each CUDA op
# against the CPU backend, cuDNN attention against the built-in flash attention, a whole
# training step on the GPU against the CPU, and runs of two ranks sharing the GPU through MPI
# with host staging), in one go, on a GPU machine with nvcc, cmake and ninja but without
# Debian's development packages or a network.
#
# The libraries come as .deb files fetched beforehand by scripts/gpu_fetch_debs.sh on a
# machine with apt; they are unpacked (dpkg -x) into a private prefix, never into /. cuDNN and
# NCCL are the CUDA toolkit's when it has them, else those of the Python wheels beside PyTorch
# (nvidia-cudnn-cu13, nvidia-nccl-cu13), or where CUDNN_ROOT / NCCL_ROOT point.
#
# Usage: scripts/gpu_check.sh [DEBS_DIR]    (default: .gpu-debs)
# Environment: TRIDENT_CUDA_ARCHITECTURES (default native: the GPU present), TRIDENT_GPU_WORK
# (default /tmp/trident-gpu: the prefix and the build), CUDNN_ROOT, NCCL_ROOT.
# A test skipped for want of a GPU counts as a failure here: this script exists to run them.
# Exit status 0 when everything built and passed. Logs go to $OUT when set (the device tool's
# output folder), else to the build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debs=${1:-$root/.gpu-debs}
work=${TRIDENT_GPU_WORK:-/tmp/trident-gpu}
prefix=$work/prefix
build=$work/build
logs=${OUT:-$build}
jobs=$(nproc)

say() { printf 'gpu_check: %s\n' "$*"; }
ls "$debs"/*.deb >/dev/null 2>&1 || { say "no .deb files in $debs: run scripts/gpu_fetch_debs.sh first"; exit 2; }
command -v nvcc >/dev/null || { say "nvcc is not on PATH"; exit 2; }
nvidia-smi -L 2>/dev/null | sed 's/^/gpu_check: /' || say "nvidia-smi is not available"

# ---- the libraries -----------------------------------------------------------------------
rm -rf "$prefix"
mkdir -p "$prefix" "$build" "$logs"
for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
lib=$prefix/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$lib/openmpi/lib:${LD_LIBRARY_PATH:-}
export PATH=$prefix/usr/bin:$PATH
# Open MPI finds its plugins and help files relative to this prefix instead of /usr.
export OPAL_PREFIX=$prefix/usr
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# cuDNN and NCCL: a folder holding include/<header> and lib*/<library>.
find_root() {  # header, library name, python module, variable
  local header=$1 library=$2 module=$3 variable=$4 candidates=()
  [[ -n ${!variable:-} ]] && candidates+=("${!variable}")
  candidates+=("$(dirname "$(dirname "$(command -v nvcc)")")" /usr/local/cuda /usr)
  local wheel
  wheel=$(python3 -c "import $module as m; print(list(m.__path__)[0])" 2>/dev/null || true)
  [[ -n $wheel ]] && candidates+=("$wheel")
  for dir in "${candidates[@]}"; do
    if [[ -f $dir/include/$header ]] &&
       ls "$dir"/lib*/$library* "$dir"/lib/x86_64-linux-gnu/$library* >/dev/null 2>&1; then
      echo "$dir"; return 0
    fi
  done
  return 1
}
cudnn=$(find_root cudnn.h libcudnn.so nvidia.cudnn CUDNN_ROOT) || { say "cuDNN 9 not found (set CUDNN_ROOT)"; exit 2; }
nccl=$(find_root nccl.h libnccl.so nvidia.nccl NCCL_ROOT) || { say "NCCL not found (set NCCL_ROOT)"; exit 2; }
say "cuDNN from $cudnn, NCCL from $nccl"
for dir in "$cudnn" "$nccl"; do
  for sub in lib lib64 lib/x86_64-linux-gnu; do [[ -d $dir/$sub ]] && export LD_LIBRARY_PATH=$dir/$sub:$LD_LIBRARY_PATH; done
done

# ---- build ---------------------------------------------------------------------------------
say "configuring and building with $jobs jobs"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${TRIDENT_CUDA_ARCHITECTURES:-native}" \
  -DCUDNN_ROOT="$cudnn" -DNCCL_ROOT="$nccl" \
  -DCMAKE_PREFIX_PATH="$prefix/usr" -DICU_ROOT="$prefix/usr" \
  -DOPENBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread" \
  -DOPENBLAS_LIBRARY="$lib/openblas-pthread/libopenblas.so" \
  -DMPI_C_COMPILER=/nonexistent -DMPI_CXX_COMPILER=/nonexistent \
  -DMPI_CXX_HEADER_DIR="$lib/openmpi/include" -DMPI_CXX_LIB_NAMES=mpi \
  -DMPI_mpi_LIBRARY="$lib/openmpi/lib/libmpi.so" -DMPIEXEC_EXECUTABLE="$prefix/usr/bin/orterun" \
  > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; say "configure failed"; exit 1; }
cmake --build "$build" -j "$jobs" > "$logs/build.log" 2>&1 || {
  grep -E "error|FAILED" "$logs/build.log" | head -40; say "build failed (log: $logs/build.log)"; exit 1; }

# ---- tests ---------------------------------------------------------------------------------
say "running the GPU tests"
set +e
(cd "$build" && ctest -L cuda --output-on-failure --timeout 900 -j 1) 2>&1 | tee "$logs/ctest.log"
status=${PIPESTATUS[0]}
set -e
skipped=$(grep -c "\*\*\*Skipped\|Not Run" "$logs/ctest.log" || true)
ran=$(grep -cE "Test +#[0-9]+:" "$logs/ctest.log" || true)
if ((ran == 0)); then say "no GPU test ran"; exit 1; fi
if ((skipped > 0)); then say "$skipped GPU tests were skipped (no GPU seen?)"; exit 1; fi
if ((status != 0)); then say "GPU tests failed"; exit 1; fi
say "all $ran GPU tests passed"
