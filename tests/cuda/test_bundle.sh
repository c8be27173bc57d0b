#!/usr/bin/env bash
# The GPU bundle is whole, proven without a GPU (ctest cuda.bundle): scripts/gpu_bundle.sh builds
# and packs it into a scratch folder; then, in a private mount namespace where this machine's
# copies of every library the bundle carries, and Open MPI's and PMIx's folders and programs,
# are hidden (an empty file or folder mounted over each), as on a GPU machine that has none
# of them:
#   - every library each program of the bundle loads through its environment (ldd) is the
#     bundle's, or a C or C++ runtime or CUDA library, which the GPU machine brings;
#   - the bundle's trident trains a tiny model on the CPU with one rank and with two under the
#     bundle's own Open MPI launcher, the two ranks' losses those of the one (data parallel);
#   - the default job's 20 steps give the CPU losses the bundle carries (the comparison
#     scripts/gpu_verify.sh makes on the GPU, made here on the CPU);
#   - the GPU test programs exit 77 (no GPU), under the launcher too;
#   - scripts/gpu_verify.sh --dry-run unpacks it, checks its manifest and walks every phase.
# Without the CUDA toolkit it is a named skip (exit 77).
# Usage: test_bundle.sh SOURCE_DIR SCRATCH_DIR
set -euo pipefail
root=$1
work=$2/bundle_test
command -v nvcc > /dev/null || { echo "SKIPPED: the bundle is built with the CUDA toolkit (nvcc)"; exit 77; }
rm -rf "$work/out" "$work/verify" "$work/run" "$work/probe"
mkdir -p "$work"

TRIDENT_BUNDLE_BUILD=$work/build TRIDENT_BUNDLE_OUT=$work/out TRIDENT_BUNDLE_LLMC=/nonexistent \
  "$root/scripts/gpu_bundle.sh"
cp "$work/out/bundle.tar.xz" "$work/"

# What the bundle's programs load from this machine, found here before anything is hidden: all
# of it but the C and C++ runtimes and the CUDA libraries (the GPU machine's own) must be hidden
# below and come from the bundle.
system='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s)\.so'
cuda='^lib(cuda|cudart|cublas|cublasLt|cudnn.*|nccl|nvrtc.*|nvidia-ml|nvJitLink)\.so'
rm -rf "$work/probe" && mkdir -p "$work/probe"
tar -xJf "$work/bundle.tar.xz" -C "$work/probe"
for program in "$work"/probe/bundle/bin/* "$work"/probe/bundle/prefix/usr/bin/orterun; do
  ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $system || $name =~ $cuda ]] || readlink -f "$path"
done | sort -u > "$work/machine_libraries"
export system cuda

# Everything below runs with the machine's copies hidden, from a file (a program reading its
# standard input, as mpirun does, would take the rest of a script given there).
cat > "$work/hidden.sh" << 'EOF'
root=$1 work=$2
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$work/empty"
: > "$work/empty_file"
hidden=0
while read -r copy; do
  mount --bind "$work/empty_file" "$copy"
  hidden=$((hidden + 1))
done < "$work/machine_libraries"
for d in "$lib/openmpi" "$lib/pmix2" /usr/share/openmpi /etc/openmpi; do
  [[ -d $d ]] && mount --bind "$work/empty" "$d"
done
for p in /usr/bin/orterun /usr/bin/orted; do
  [[ -e $p ]] && mount --bind "$work/empty_file" "$p"
done
echo "test_bundle: $hidden libraries of this machine hidden, Open MPI and PMIx too"

# The check's own set-up: unpack, manifest, CUDA libraries, every phase walked.
TRIDENT_BUNDLE=$work/bundle.tar.xz TRIDENT_VERIFY_WORK=$work/verify OUT=$work/verify/out \
  "$root/scripts/gpu_verify.sh" --dry-run
env=$work/verify/trident-env
b=$work/verify/bundle

mkdir -p "$work/run"
cd "$work/run"
# Every library each program loads is the bundle's, or one it leaves to the GPU machine.
for program in "$b"/bin/* "$b"/prefix/usr/bin/orterun; do
  "$env" ldd "$program" > ldd.txt 2>&1 || { cat ldd.txt; echo "test_bundle: ldd $program failed"; exit 1; }
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $name =~ $system || $name =~ $cuda || $path == "$b"/* ]] ||
      { echo "test_bundle: $program loads $name from $path, not from the bundle"; exit 1; }
  done < ldd.txt
done

python3 - << 'PY'
import random, struct
tokens = [random.Random(7).randrange(64) for _ in range(4000)]
with open("train.bin", "wb") as f:  # an llm.c shard: 256 int32 of header, then uint16 tokens
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
cat > tiny.yaml << 'YAML'
model: {vocab_size: 64, seq_len: 16, layers: 2, hidden: 32, heads: 4, ffn_hidden: 64}
training: {micro_batch: 2, global_batch: 8, steps: 3, warmup_steps: 1, threads: 1}
data: {train: train.bin}
device: cpu
YAML
"$env" "$b/bin/trident" train --config tiny.yaml --set logging.metrics=one.jsonl
"$env" "$b/prefix/usr/bin/mpirun" --oversubscribe -n 2 "$b/bin/trident" train --config tiny.yaml \
  --set parallel.data=2 --set logging.metrics=two.jsonl
python3 - << 'PY'
import json
def losses(path):
    return [json.loads(l)["loss"] for l in open(path) if '"loss"' in l]
one, two = losses("one.jsonl"), losses("two.jsonl")
assert len(one) == 3 and len(two) == 3, (one, two)
for a, b in zip(one, two):
    assert abs(a - b) <= 1e-5 * abs(a), (one, two)
print("test_bundle: one rank", one, "two ranks", two)
PY

# The comparison with the losses shipped in the bundle, run on the CPU here (the GPU machine
# runs it on the GPU): the same binary on the same machine gives the same losses.
(cd "$root" && TRIDENT_CHECK_DEVICE=cpu TRIDENT_CHECKS=gpt2 TRIDENT_CHECK_DATA=$b/data/kjv/gpt2 \
   scripts/gpu_expected_losses.sh check "$b/bin/trident" "$b/expected" "$env")

status=0
"$env" "$b/bin/trident_cuda_tests" > cuda_tests.log 2>&1 || status=$?
((status == 77)) || { cat cuda_tests.log; echo "test_bundle: the GPU tests exited $status, not 77"; exit 1; }
status=0
"$env" "$b/prefix/usr/bin/mpirun" --oversubscribe -n 2 "$b/bin/trident_cuda_comm_tests" > comm.log 2>&1 ||
  status=$?
grep -q 'SKIPPED: ' comm.log || { cat comm.log; echo "test_bundle: the communicator test did not skip"; exit 1; }
echo "test_bundle: the bundle is whole"
EOF
exec unshare --mount bash -euo pipefail "$work/hidden.sh" "$root" "$work" < /dev/null
