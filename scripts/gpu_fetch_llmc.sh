#!/usr/bin/env bash
# Brings the sources scripts/bench_gpu.sh builds beside Trident on the GPU machine, which has
# no network: llm.c (github.com/karpathy/llm.c: train_gpt2.cu, llmc/ and its Makefile) and
# the headers of NVIDIA's cuDNN frontend (github.com/NVIDIA/cudnn-frontend: include/), which
# llm.c's cuDNN attention is compiled against. They go to .gpu-src/llm.c (ignored by git; the
# frontend in its cudnn-frontend/include, where llm.c's Makefile looks), with SOURCES naming
# the commits, and travel to the GPU machine with the tree. Nothing of them enters the
# repository.
#
# Each source is a git repository already on this machine (a clone or a bare mirror) or a
# URL to clone (shallow) when there is a network.
# Usage: scripts/gpu_fetch_llmc.sh [LLMC_GIT [CUDNN_FRONTEND_GIT]]
#   defaults: https://github.com/karpathy/llm.c https://github.com/NVIDIA/cudnn-frontend
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
llmc_source=${1:-https://github.com/karpathy/llm.c}
frontend_source=${2:-https://github.com/NVIDIA/cudnn-frontend}
out=$root/.gpu-src/llm.c
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A git directory for a source: the local repository itself, or a shallow clone of the URL.
git_dir_of() {  # source, name
  if [[ -d $1 ]]; then
    git -C "$1" rev-parse --git-dir > /dev/null 2>&1 ||
      { echo "gpu_fetch_llmc: $1 is not a git repository" >&2; return 1; }
    (cd "$1" && cd "$(git rev-parse --git-dir)" && pwd)
  else
    git clone --quiet --depth 1 "$1" "$tmp/$2" >&2 ||
      { echo "gpu_fetch_llmc: cannot clone $1 (no network? pass a local clone)" >&2; return 1; }
    echo "$tmp/$2/.git"
  fi
}
llmc_git=$(git_dir_of "$llmc_source" llm.c)
frontend_git=$(git_dir_of "$frontend_source" cudnn-frontend)

rm -rf "$out"
mkdir -p "$out/cudnn-frontend"
git --git-dir="$llmc_git" archive HEAD Makefile train_gpt2.cu llmc | tar -x -C "$out"
git --git-dir="$frontend_git" archive HEAD include | tar -x -C "$out/cudnn-frontend"
{
  echo "llm.c $(git --git-dir="$llmc_git" rev-parse HEAD) $(git --git-dir="$llmc_git" log -1 --format=%cs HEAD)"
  echo "cudnn-frontend $(git --git-dir="$frontend_git" rev-parse HEAD) $(git --git-dir="$frontend_git" log -1 --format=%cs HEAD)"
} > "$out/SOURCES"
cat "$out/SOURCES"
du -sh "$out"
