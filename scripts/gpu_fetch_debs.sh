#!/usr/bin/env bash
# Fetches the Debian packages scripts/gpu_check.sh needs on a GPU machine that has nvcc,
# cmake and ninja but neither Debian's development packages nor a network: the headers and
# CMake configs of yaml-cpp, CLI11, Catch2, OpenBLAS, Open MPI and ICU, Open MPI's launcher,
# and every shared library these load. Run it here (a Debian machine where scripts/setup.sh
# has installed them), then carry the folder to the GPU machine.
#
# The libraries are found by what the installed files actually load (ldd), not by the
# packages' declared dependencies, which would drag in compilers; libraries every Linux system
# provides (the C and C++ runtimes and a few more) are left out, since a second copy from
# another distribution would shadow the GPU machine's own.
#
# The CUDA libraries are not among them. They come with the GPU machine's toolkit (or the
# Python wheels beside its PyTorch): cuDNN, NCCL, and NVRTC, which cuDNN's runtime-compiled
# engines load to build fused attention. libnvrtc.so.13 alone is 109 MB, past the 64 MiB that
# travels to the device machine with the tree, and Debian 12 has no CUDA 13 build of it (its
# non-free libnvrtc11.2 is CUDA 11's); scripts/gpu_check.sh finds it there and puts it on
# LD_LIBRARY_PATH, or stops saying it is missing.
#
# About 39 MiB of .debs; with the tree, the default job's data (data/kjv, data/gpt2) and
# llm.c's sources (.gpu-src, scripts/gpu_fetch_llmc.sh) what travels stays under the device
# machine's 64 MiB, which the end of this script checks.
# Usage: scripts/gpu_fetch_debs.sh [DIR]     (default: .gpu-debs, ignored by git)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.gpu-debs}

wanted=(libyaml-cpp-dev libcli11-dev catch2 libopenblas-dev libopenblas-pthread-dev
        libopenblas0-pthread libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libicu-dev
        libicu72)
system=(libc6 libgcc-s1 libstdc++6 libgomp1 zlib1g libzstd1 liblzma5 libbz2-1.0 libudev1
        libsystemd0 libcap2 libgcrypt20 libgpg-error0 liblz4-1 libselinux1 libpcre2-8-0
        libcrypt1 libssl3 libtinfo6 libmd0 libbsd0 libuuid1 libatomic1)

for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    { echo "gpu_fetch_debs: $p is not installed here; run scripts/setup.sh first" >&2; exit 1; }
done

declare -A keep=() seen=()
for p in "${wanted[@]}"; do keep[$p]=1; done
for p in "${system[@]}"; do keep[$p]=0; done
queue=("${wanted[@]}")
while ((${#queue[@]})); do
  package=${queue[0]}
  queue=("${queue[@]:1}")
  # Every ELF file of the package (libraries, plugins, programs; through the symlinks of
  # -dev packages too, whose targets live in the runtime package) and what each loads.
  while IFS= read -r file; do
    real=$(readlink -f "$file")
    [[ -f $real && -z ${seen[$real]+x} ]] || continue
    head -c 4 "$real" 2>/dev/null | grep -q "ELF" || continue
    while IFS= read -r lib; do
      [[ -n ${seen[$lib]+x} ]] && continue
      seen[$lib]=1
      owner=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1) || true
      [[ -z $owner ]] && owner=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1) || true
      [[ -z $owner || -n ${keep[$owner]+x} ]] && continue
      keep[$owner]=1
      queue+=("$owner")
    done < <(echo "$real"; ldd "$real" 2>/dev/null | awk '/=> \//{print $3}')
  done < <(dpkg -L "$package")
done

packages=()
for p in "${!keep[@]}"; do [[ ${keep[$p]} == 1 ]] && packages+=("$p"); done
mkdir -p "$out"
rm -f "$out"/*.deb
# apt fetches as the _apt user when it can write there; as root into a private folder it
# warns and downloads unsandboxed, which is fine for a download.
(cd "$out" && apt-get download -q "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
count=$(ls "$out"/*.deb | wc -l)
echo "gpu_fetch_debs: $count packages, $(du -sh "$out" | cut -f1) in $out"
((count == ${#packages[@]})) || { echo "gpu_fetch_debs: expected ${#packages[@]} packages" >&2; exit 1; }

# What the device machine receives: the tracked tree, this folder, the data folders and
# llm.c's sources.
tree=$(cd "$root" && git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carried=0
for dir in "$out" "$root/data/kjv" "$root/data/gpt2" "$root/.gpu-src"; do
  [[ -d $dir ]] && carried=$((carried + $(du -sb "$dir" | cut -f1)))
done
total=$(((tree + carried) / 1048576))
echo "gpu_fetch_debs: tree, .debs, data and .gpu-src together: $total MiB (the device machine takes 64)"
((total < 64)) || { echo "gpu_fetch_debs: too large to travel" >&2; exit 1; }
