#!/usr/bin/env bash
# Packs everything scripts/gpu_verify.sh runs on a GPU machine that compiles nothing
# (docs/GPU.md): the GPU build's binaries and every library they and Open MPI load beyond the C
# and C++ runtimes and the CUDA libraries, in one .gpu-bundle/bundle.tar.xz with a manifest.
# Runs here, on a Debian machine with the CUDA toolkit (no GPU needed), after scripts/setup.sh.
#
# The build (build-cuda/, Release) is for Hopper (sm_90a: the H100 and the H200) and for any
# x86-64-v3 CPU (not -march=native: the GPU machine's processor is not this one's). The
# libraries are found by what the files load (ldd), copied flat into lib/; Open MPI's launcher
# and its plugins keep Debian's layout under prefix/usr, where OPAL_PREFIX and PMIX_PREFIX
# find them. Open MPI's network plugins (UCX, libfabric, verbs, PSM) stay behind: one GPU
# machine needs shared memory only, and their own libraries would double the bundle.
#
# Usage: scripts/gpu_bundle.sh [--no-build | --update]
#   --no-build   pack build-cuda/ as it is (it must hold the three binaries)
#   --update     rebuild, then pack only the binaries that differ from the bundle's, in
#                .gpu-bundle/update.tar.xz (a second device call after a fix)
# Environment: TRIDENT_BUNDLE_BUILD (default build-cuda), TRIDENT_BUNDLE_OUT (default
# .gpu-bundle), TRIDENT_BUNDLE_LLMC (llm.c's sources, default .gpu-src/llm.c; absent: no llm.c),
# TRIDENT_BUNDLE_JOBS (default nproc), TRIDENT_BUNDLE_MAX_MIB (default 40: the device call
# carries 64 MiB with the tree).
# Output: .gpu-bundle/bundle.tar.xz and .gpu-bundle/MANIFEST (also inside the archive: the
# commit, the toolkit, every file's size and sha256). Beside the binaries and libraries it holds
# the data the checks read (GPT-2's tokenizer files, the default job's corpus from
# scripts/prepare_kjv.sh), the CPU's losses of the checks that scripts/gpu_expected_losses.sh
# runs on the GPU, and, when scripts/gpu_fetch_llmc.sh has brought its sources, llm.c's
# trainer for the benchmark.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TRIDENT_BUNDLE_BUILD:-$root/build-cuda}
jobs=${TRIDENT_BUNDLE_JOBS:-$(nproc)}
max_mib=${TRIDENT_BUNDLE_MAX_MIB:-40}
out=${TRIDENT_BUNDLE_OUT:-$root/.gpu-bundle}
llmc_src=${TRIDENT_BUNDLE_LLMC:-$root/.gpu-src/llm.c}
targets=(trident trident_cuda_tests trident_cuda_comm_tests)
binaries=(trident tests/cuda/trident_cuda_tests tests/cuda/trident_cuda_comm_tests)
multiarch=x86_64-linux-gnu

say() { printf 'gpu_bundle: %s\n' "$*"; }
mode=${1:-}

# llm.c's CUDA trainer, the benchmark's second reference (scripts/bench_gpu.sh), when
# scripts/gpu_fetch_llmc.sh has brought its sources: bf16, cuDNN attention, one GPU, sm_90.
build_llmc() {
  local src=$llmc_src dir=$stage/llm.c
  [[ -f $src/train_gpt2.cu ]] || { say "no .gpu-src/llm.c: the bundle has no llm.c"; return 0; }
  cp -r "$src" "$dir"
  # Linked without NVML (the Makefile adds it when nvidia-smi is found), which llm.c uses only
  # where nvml.h was there to compile against, and this toolkit has none.
  # CUDA 13 dropped cudaMemAdvise's device-number form, which llm.c calls once where it falls
  # back to managed memory (never on the timed path): the host as a cudaMemLocation.
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$dir/llmc/cuda_utils.cuh"
  make -C "$dir" train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 PRECISION=BF16 \
    GPU_COMPUTE_CAPABILITY=90 CUDNN_FRONTEND_PATH=cudnn-frontend/include \
    NVCC_LDFLAGS="-lcublas -lcublasLt -lcudnn -lnvrtc -L$(dirname "$(command -v nvcc)")/../lib64/stubs -lcuda" > "$stage/llmc.log" 2>&1 ||
    { tail -20 "$stage/llmc.log"; say "llm.c's build failed"; exit 1; }
  strip -o "$b/bin/train_gpt2cu" "$dir/train_gpt2cu"
  cp "$src/SOURCES" "$b/LLMC_SOURCES"
}
# --update: the binaries that differ from the bundle's, in update.tar.xz with their sha256
# (UPDATE), which scripts/gpu_verify.sh unpacks over the bundle: a fix travels in seconds.
pack_update() {
  local f changed=()
  for f in "$b"/bin/*; do
    grep -q " $(sha256sum "$f" | cut -d' ' -f1) bin/$(basename "$f")\$" "$out/MANIFEST" ||
      changed+=("bin/$(basename "$f")")
  done
  ((${#changed[@]})) || { say "no binary differs from the bundle's"; rm -f "$out/update.tar.xz"; return; }
  (cd "$b" && sha256sum "${changed[@]}" > UPDATE)
  tar -C "$stage" -cf - bundle/UPDATE "${changed[@]/#/bundle/}" | xz -T "$jobs" > "$out/update.tar.xz"
  say "$out/update.tar.xz: ${changed[*]} ($(($(stat -c %s "$out/update.tar.xz") / 1024)) KiB)"
}

[[ $mode == --update && ! -f $out/MANIFEST ]] && { say "--update needs a bundle first"; exit 1; }
[[ $mode == --update ]] && mode=update
if [[ $mode != --no-build ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DTRIDENT_NATIVE=OFF > /dev/null
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
fi
for f in "${binaries[@]}"; do
  [[ -x $build/$f ]] || { say "$build/$f is missing: build it first (without --no-build)"; exit 1; }
done
grep -q '^CMAKE_CUDA_ARCHITECTURES:.*90a' "$build/CMakeCache.txt" ||
  { say "$build is not configured for sm_90a"; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
b=$stage/bundle
ompi_lib=/usr/lib/$multiarch/openmpi/lib
pmix=/usr/lib/$multiarch/pmix2
mkdir -p "$b/bin" "$b/lib" "$b/prefix/usr/bin" "$b/prefix$ompi_lib/openmpi3" \
         "$b/prefix$pmix/lib/pmix" "$b/prefix/usr/share"

for f in "${binaries[@]}"; do strip -o "$b/bin/$(basename "$f")" "$build/$f"; done
if [[ $mode == update ]]; then pack_update; exit; fi
build_llmc
cp /usr/bin/orterun /usr/bin/orted "$b/prefix/usr/bin/"
ln -s orterun "$b/prefix/usr/bin/mpirun"
ln -s orterun "$b/prefix/usr/bin/mpiexec"
for plugin in "$ompi_lib"/openmpi3/*.so; do
  case $(basename "$plugin") in
    *ucx* | *ofi* | *openib* | *psm*) ;;
    *) cp "$plugin" "$b/prefix$ompi_lib/openmpi3/" ;;
  esac
done
cp "$pmix"/lib/pmix/*.so "$b/prefix$pmix/lib/pmix/"
cp -r "$pmix/share" "$b/prefix$pmix/"
cp -r /usr/share/openmpi "$b/prefix/usr/share/"

# The libraries: what every ELF file of the bundle loads, found through ldd here, except the
# C and C++ runtimes the GPU machine has newer (a second, older copy would shadow them) and the
# CUDA libraries, which come with the GPU machine's toolkit and wheels (scripts/gpu_libs.sh).
system='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s)\.so'
cuda='^lib(cuda|cudart|cublas|cublasLt|cudnn.*|nccl|nvrtc.*|nvidia-ml|nvJitLink)\.so'
declare -A copied=()
while IFS= read -r elf; do
  while read -r name path; do
    [[ $name =~ $system || $name =~ $cuda || -n ${copied[$name]:-} ]] && continue
    [[ $path == /* ]] || { say "$elf needs $name, which is not found here"; exit 1; }
    cp -L "$path" "$b/lib/$name"
    copied[$name]=1
  done < <(ldd "$elf" | awk '$2 == "=>" {print $1, $3}')
done < <(find "$b" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c \
           'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
# Libraries the copied ones load (OpenBLAS's gfortran, for one) are found by the same pass
# over lib/: ldd already resolves the whole tree of each file.

# The data the checks read: GPT-2's tokenizer files (scripts/setup.sh fetches them) and the
# default job's corpus, the tree's or made here by scripts/prepare_kjv.sh with the new binary.
for f in encoder.json vocab.bpe; do
  [[ -f $root/data/gpt2/$f ]] || { say "data/gpt2/$f is missing: run scripts/setup.sh"; exit 1; }
done
mkdir -p "$b/data/gpt2" "$b/data/kjv/gpt2"
cp "$root/data/gpt2/encoder.json" "$root/data/gpt2/vocab.bpe" "$b/data/gpt2/"
if [[ -f $root/data/kjv/gpt2/train.bin && -f $root/data/kjv/gpt2/valid.bin ]]; then
  cp "$root/data/kjv/gpt2/train.bin" "$root/data/kjv/gpt2/valid.bin" "$b/data/kjv/gpt2/"
else
  (cd "$root" && TRIDENT=$build/trident scripts/prepare_kjv.sh "$stage/kjv" > /dev/null) ||
    { say "scripts/prepare_kjv.sh failed"; exit 1; }
  cp "$stage/kjv/train.bin" "$stage/kjv/valid.bin" "$b/data/kjv/gpt2/"
fi
# The losses the GPU must reproduce, computed here on the CPU (scripts/gpu_expected_losses.sh).
(cd "$root" && TRIDENT_CHECK_DATA=$b/data/kjv/gpt2 scripts/gpu_expected_losses.sh make \
   "$build/trident" "$b/expected") || { say "the expected losses could not be computed"; exit 1; }
{
  echo "commit $(git -C "$root" rev-parse HEAD)$(git -C "$root" diff --quiet HEAD -- . ':!.gpu-bundle' || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) by $(nvcc --version | sed -n 's/.*release /CUDA /p')"
  echo "files"
  (cd "$b" && find . -type f ! -name MANIFEST | sort | while read -r f; do
     printf '%s %s %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)" "${f#./}"; done)
} > "$b/MANIFEST"

mkdir -p "$out"
tar -C "$stage" -cf - bundle | xz -T "$jobs" -6 > "$out/bundle.tar.xz.new"
mv "$out/bundle.tar.xz.new" "$out/bundle.tar.xz"
rm -f "$out/update.tar.xz"  # an update of an earlier bundle
cp "$b/MANIFEST" "$out/MANIFEST"
size=$(stat -c %s "$out/bundle.tar.xz")
say "$out/bundle.tar.xz: $((size / 1024)) KiB, $(grep -c '^[0-9]' "$b/MANIFEST") files"
((size <= max_mib * 1024 * 1024)) || { say "larger than $max_mib MiB"; exit 1; }
