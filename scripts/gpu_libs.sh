# Sourced by scripts/gpu_verify.sh: finds the CUDA libraries a GPU
# program of this repository builds and runs with, on a machine where they may come with the
# CUDA toolkit or with the Python wheels beside PyTorch (nvidia-cudnn-cu13, nvidia-nccl-cu13,
# nvidia-cuda-nvrtc), or where CUDNN_ROOT / NCCL_ROOT / NVRTC_DIR point. Needs nvcc on PATH.
# Sets, or returns non-zero with gpu_libs_missing saying what is missing:
#   cuda_home, cuda_major   the toolkit (from nvcc) and its major version
#   cudnn, nccl             folders holding include/<header> and lib*/<library>
#   nvrtc                   the folder of libnvrtc.so.<cuda_major>, which cuDNN's runtime-compiled
#                           engines (fused attention among them) load when a graph is built
#   gpu_lib_path            their library folders, ':'-separated: what LD_LIBRARY_PATH of any
#                           CUDA program may take (never the bundle's own libraries)
find_gpu_libs() {
  gpu_libs_missing=""
  cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  cuda_major=$(nvcc --version | sed -nE 's/.*release ([0-9]+)\..*/\1/p')
  # Folders where Python's NVIDIA wheels keep their files (nvidia/<name>/{include,lib}).
  local wheels dir w
  wheels=$(python3 -c "import nvidia, os; print(os.pathsep.join(nvidia.__path__))" 2>/dev/null || true)
  local wheel_dirs=() wheel_roots=()
  IFS=: read -r -a wheel_roots <<< "$wheels"
  for w in "${wheel_roots[@]}"; do [[ -d $w ]] && wheel_dirs+=("$w"/*); done
  # A folder holding include/<header> and lib*/<library>: header, library, wheel name, variable.
  gpu_lib_root() {
    local header=$1 library=$2 wheel=$3 variable=$4 candidates=() d
    [[ -n ${!variable:-} ]] && candidates+=("${!variable}")
    candidates+=("$cuda_home" /usr/local/cuda /usr)
    for d in "${wheel_dirs[@]}"; do [[ $(basename "$d") == "$wheel" ]] && candidates+=("$d"); done
    for d in "${candidates[@]}"; do
      if [[ -f $d/include/$header ]] &&
         { compgen -G "$d/lib*/$library*" > /dev/null ||
           compgen -G "$d/lib/x86_64-linux-gnu/$library*" > /dev/null; }; then
        echo "$d"; return 0
      fi
    done
    return 1
  }
  cudnn=$(gpu_lib_root cudnn.h libcudnn.so cudnn CUDNN_ROOT) ||
    { gpu_libs_missing="cuDNN 9 (set CUDNN_ROOT)"; return 1; }
  nccl=$(gpu_lib_root nccl.h libnccl.so nccl NCCL_ROOT) ||
    { gpu_libs_missing="NCCL (set NCCL_ROOT)"; return 1; }
  local folders=() sub
  for dir in "$cudnn" "$nccl"; do
    for sub in lib lib64 lib/x86_64-linux-gnu; do [[ -d $dir/$sub ]] && folders+=("$dir/$sub"); done
  done
  # NVRTC of the toolkit's major version, as cuDNN loads it (libnvrtc.so.<major>).
  nvrtc=""
  local candidates=()
  [[ -n ${NVRTC_DIR:-} ]] && candidates+=("$NVRTC_DIR")
  candidates+=("$cuda_home/lib64" "$cuda_home/lib" "$cuda_home/targets/x86_64-linux/lib")
  for dir in "${wheel_dirs[@]}"; do candidates+=("$dir/lib"); done
  candidates+=(/usr/lib/x86_64-linux-gnu /usr/lib64)
  for dir in "${candidates[@]}"; do
    [[ -e $dir/libnvrtc.so.$cuda_major ]] && { nvrtc=$dir; break; }
  done
  if [[ -z $nvrtc ]]; then
    local found
    found=$(ldconfig -p 2>/dev/null | awk -v n="libnvrtc.so.$cuda_major" '$1 == n {print $NF; exit}')
    [[ -n $found ]] && nvrtc=$(dirname "$found")
  fi
  [[ -n $nvrtc ]] ||
    { gpu_libs_missing="libnvrtc.so.$cuda_major (set NVRTC_DIR): cuDNN's fused attention cannot build without it"; return 1; }
  folders+=("$nvrtc")
  gpu_lib_path=""
  for dir in "${folders[@]}"; do  # each once
    [[ ":$gpu_lib_path:" == *":$dir:"* ]] || gpu_lib_path=${gpu_lib_path:+$gpu_lib_path:}$dir
  done
}
