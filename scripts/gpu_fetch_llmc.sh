#!/usr/bin/env bash
# Brings the sources of the benchmark's second reference, which scripts/gpu_bundle.sh builds
# here and packs for the GPU machine (scripts/bench_gpu.sh runs it there): llm.c (github.com/karpathy/llm.c: train_gpt2.cu, llmc/ and its Makefile) and
# the headers of NVIDIA's cuDNN frontend (github.com/NVIDIA/cudnn-frontend: include/), which
# llm.c's cuDNN attention is compiled against. Each is pinned (below), so that every
# measurement builds the same code. They go to .gpu-src/llm.c (ignored by git; the frontend in
# its cudnn-frontend/include, where llm.c's Makefile looks), with SOURCES naming the commits.
# Nothing of them enters the repository or the bundle but the built trainer.
#
# Each source is a git repository already on this machine (a clone or a bare mirror, which
# must hold the pinned commit) or a URL to fetch the pinned commit from when there is a
# network.
# Usage: scripts/gpu_fetch_llmc.sh [LLMC_GIT [CUDNN_FRONTEND_GIT]]
#   defaults: https://github.com/karpathy/llm.c https://github.com/NVIDIA/cudnn-frontend
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
llmc_source=${1:-https://github.com/karpathy/llm.c}
frontend_source=${2:-https://github.com/NVIDIA/cudnn-frontend}
# llm.c's last commit (2025-05-10); the cuDNN frontend's release 1.23.0 (2026-04-29), whose
# SDPA graphs the cuDNN 9 releases of CUDA 13 take, and which still has every call llm.c makes.
llmc_ref=f1e2ace651495b74ae22d45d1723443fd00ecd3a
frontend_ref=v1.23.0
out=$root/.gpu-src/llm.c
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A git directory holding `ref`: the local repository itself, or the commit fetched from a URL.
git_dir_of() {  # source, name, ref
  local dir
  if [[ -d $1 ]]; then
    git -C "$1" rev-parse --git-dir > /dev/null 2>&1 ||
      { echo "gpu_fetch_llmc: $1 is not a git repository" >&2; return 1; }
    dir=$(cd "$1" && cd "$(git rev-parse --git-dir)" && pwd)
  else
    dir=$tmp/$2.git
    git init --quiet --bare "$dir"
    git --git-dir="$dir" fetch --quiet --depth 1 "$1" "$3" >&2 ||
      { echo "gpu_fetch_llmc: cannot fetch $3 from $1 (no network? pass a local clone)" >&2; return 1; }
    git --git-dir="$dir" update-ref "refs/pinned" FETCH_HEAD
  fi
  git --git-dir="$dir" rev-parse --verify --quiet "$3^{commit}" > /dev/null ||
    git --git-dir="$dir" rev-parse --verify --quiet "refs/pinned^{commit}" > /dev/null ||
    { echo "gpu_fetch_llmc: $1 does not hold $3" >&2; return 1; }
  echo "$dir"
}
# The commit to archive: the pinned ref, or what was fetched for it.
commit_of() {  # git dir, ref
  git --git-dir="$1" rev-parse --verify --quiet "$2^{commit}" ||
    git --git-dir="$1" rev-parse --verify "refs/pinned^{commit}"
}
llmc_git=$(git_dir_of "$llmc_source" llm.c "$llmc_ref")
frontend_git=$(git_dir_of "$frontend_source" cudnn-frontend "$frontend_ref")
llmc_commit=$(commit_of "$llmc_git" "$llmc_ref")
frontend_commit=$(commit_of "$frontend_git" "$frontend_ref")

rm -rf "$out"
mkdir -p "$out/cudnn-frontend"
git --git-dir="$llmc_git" archive "$llmc_commit" Makefile train_gpt2.cu llmc | tar -x -C "$out"
git --git-dir="$frontend_git" archive "$frontend_commit" include | tar -x -C "$out/cudnn-frontend"
{
  echo "llm.c $llmc_commit $(git --git-dir="$llmc_git" log -1 --format=%cs "$llmc_commit")"
  echo "cudnn-frontend $frontend_ref $frontend_commit $(git --git-dir="$frontend_git" log -1 --format=%cs "$frontend_commit")"
} > "$out/SOURCES"
cat "$out/SOURCES"
du -sh "$out"
