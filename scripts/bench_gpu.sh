#!/usr/bin/env bash
# GPT-2 training speed on one GPU, side by side: Trident (`trident bench`), llm.c's
# train_gpt2cu, and PyTorch (scripts/bench_gpt2_torch.py: torch.compile,
# scaled_dot_product_attention, fused AdamW), on GPT-2 124M and 350M, and Trident alone on
# GPT-2 1.5B. All in bf16 with T = 1024 and the same tokens per step, on random tokens.
#
# For each run: tokens/s (the median step of the timed steps), model TFLOP/s and MFU, and the
# peak GPU memory. The FLOPs are Megatron-LM's model FLOPs for every trainer alike
# (docs/FORMULAS.md, "FLOPs per step"; Narayanan et al., arXiv 2104.04473):
#   F per token = 72·L·h²·(1 + s/(12h) + V/(12·L·h)),  V = 50257, s = 1024
# and MFU divides the rate by the dense bf16 peak of an H100 SXM, 989 TFLOP/s (BENCH_PEAK).
# The peak memory is the most nvidia-smi saw in use during the run, less what was in use
# before it (the same measure for the three; each trainer's own figure is kept too).
#
# One device call of 10 minutes holds a subset (docs/GPU.md gives the calls): BENCH_TRAINERS
# and BENCH_MODELS choose it, and rows measured by earlier calls are kept: the rows of
# BENCH_RESULTS (a bench_gpu.jsonl an earlier call returned, carried back in) are merged with
# this call's, a row measured again replacing the old one, and the table is of them all.
#
# What it needs beside the tree (ignored by git, so brought along explicitly):
#   .gpu-debs/        Trident's libraries, from scripts/gpu_fetch_debs.sh (for Trident's build)
#   .gpu-src/llm.c/   llm.c and the cuDNN frontend headers, pinned, from scripts/gpu_fetch_llmc.sh
#                     (for llm.c's)
# and, on the GPU machine, nvidia-smi and python3 (with PyTorch for its runs); nvcc, cmake and
# ninja to build Trident, make and nvcc to build llm.c, each only when its trainer runs.
# Trident is built by scripts/gpu_check.sh (TRIDENT_GPU_BUILD_ONLY=1) in .gpu-work/check, where
# a check earlier on the same machine leaves it built; llm.c by its Makefile (bf16, cuDNN
# attention, one GPU) in .gpu-work/llm.c, linked with the toolkit's stub of libnvidia-ml and
# run with the folders of cuDNN and NVRTC alone on LD_LIBRARY_PATH (scripts/gpu_libs.sh).
#
# Usage: scripts/bench_gpu.sh
# Environment: BENCH_MODELS (default "124m 350m 1.5b"), BENCH_TRAINERS (default
# "trident llmc pytorch"; 1.5b is Trident's alone), BENCH_RESULTS (rows to keep, default
# .gpu-work/bench_gpu.jsonl), BENCH_GLOBAL_BATCH (sequences per step, default 64),
# BENCH_MICRO_124M / _350M / _1_5B (micro batches, default 16 / 8 / 4: raise them to the
# largest that fits), BENCH_RECOMPUTE_1_5B (Trident's training.recompute at 1.5B, default
# selective), BENCH_STEPS (timed, default 10), BENCH_WARMUP (untimed first, default 3),
# BENCH_PEAK (TFLOP/s, default 989), TRIDENT_BENCH_BUDGET (seconds for everything, default
# 570), TRIDENT_GPU_WORK (default .gpu-work).
# Output ($OUT when set, else .gpu-work/bench), four files: bench_gpu.log (this output),
# bench_gpu.jsonl (every row, a line each), bench_gpu.md (the table, also printed last) and
# bench_logs.tar.gz (the builds' and every run's logs). Exit status 0 when every run of this
# call gave a figure, 1 otherwise, 2 when something it needs is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${TRIDENT_GPU_WORK:-$root/.gpu-work}
out=${OUT:-$work/bench}
budget=${TRIDENT_BENCH_BUDGET:-570}
models=${BENCH_MODELS:-124m 350m 1.5b}
trainers=${BENCH_TRAINERS:-trident llmc pytorch}
kept=${BENCH_RESULTS:-$work/bench_gpu.jsonl}
global_batch=${BENCH_GLOBAL_BATCH:-64}
steps=${BENCH_STEPS:-10}
warmup=${BENCH_WARMUP:-3}
peak=${BENCH_PEAK:-989}
seq=1024
started=$(date +%s)
logs=$work/bench_logs
rm -rf "$logs"
mkdir -p "$work" "$out" "$logs"
exec > >(tee "$out/bench_gpu.log") 2>&1

say() { printf 'bench_gpu: %s\n' "$*"; }
left() { echo $((budget - ($(date +%s) - started))); }
limit() { local l; l=$(left); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo "$l"; }
has() { [[ " $2 " == *" $1 "* ]]; }
# Whether this call runs `trainer` on some model (1.5B is Trident's alone).
runs() {
  local model
  has "$1" "$trainers" || return 1
  for model in $models; do [[ $model != 1.5b || $1 == trident ]] && return 0; done
  return 1
}
pack_logs() { tar -czf "$out/bench_logs.tar.gz" -C "$work" bench_logs 2> /dev/null; }

needed=(nvidia-smi python3)
runs trident && needed+=(nvcc cmake ninja)
runs llmc && needed+=(nvcc make)
for tool in "${needed[@]}"; do
  command -v "$tool" > /dev/null || { say "$tool not found"; exit 2; }
done
llmc_src=$root/.gpu-src/llm.c
if runs llmc && [[ ! -f $llmc_src/train_gpt2.cu ]]; then
  say ".gpu-src/llm.c is missing: run scripts/gpu_fetch_llmc.sh and bring that folder"
  exit 2
fi
say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
command -v nvcc > /dev/null && say "nvcc: $(nvcc --version | sed -n 's/.*release //p')"
runs pytorch && say "PyTorch: $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
[[ -f $llmc_src/SOURCES ]] && say "sources: $(tr '\n' ';' < "$llmc_src/SOURCES")"
say "this call: trainers $trainers; models $models; rows kept from $kept"

# ---- builds, each only for a trainer this call runs ----------------------------------------
trident_built=0 llmc_built=0
trident_build=$work/check/build llmc_build=$work/llm.c
if runs trident; then
  TRIDENT_GPU_BUILD_ONLY=1 TRIDENT_GPU_WORK=$work/check TRIDENT_GPU_BUDGET=$(limit 330) \
    OUT=$logs/trident_build "$root/scripts/gpu_check.sh" > "$logs/trident_build.log" 2>&1
  if (($? == 0)); then
    trident_built=1
    # shellcheck source=/dev/null
    source "$work/check/env.sh"  # TRIDENT_ENV: how Trident's processes run
    say "Trident built ($trident_build/trident)"
  else
    say "Trident's build failed (trident_build.log):"
    tail -5 "$logs/trident_build.log"
  fi
fi
if runs llmc; then
  # shellcheck source=scripts/gpu_libs.sh
  source "$root/scripts/gpu_libs.sh"
  if find_gpu_libs; then
    # llm.c links cuDNN and NVRTC through a folder holding libcudnn.so and libnvrtc.so (a
    # wheel has only .so.9 and .so.13), and libnvidia-ml through the toolkit's stub (the
    # driver has only .so.1; without a stub, the driver's library itself); it runs with the
    # driver's. Command-line variables replace the Makefile's own, so these repeat what it
    # would add.
    rm -rf "$llmc_build"
    cp -r "$llmc_src" "$llmc_build"
    # CUDA 13 dropped cudaMemAdvise's device-number form, which llm.c calls once, where it
    # falls back to managed memory (never on the timed path): the host as a cudaMemLocation.
    if ((cuda_major >= 13)); then
      sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$llmc_build/llmc/cuda_utils.cuh"
      say "llm.c adapted to CUDA $cuda_major (cudaMemAdvise takes a cudaMemLocation)"
    fi
    links=$work/llmc-lib
    mkdir -p "$links"
    library=$(compgen -G "$cudnn/lib*/libcudnn.so*" | sort | head -1)
    [[ -z $library ]] && library=$(compgen -G "$cudnn/lib/x86_64-linux-gnu/libcudnn.so*" | sort | head -1)
    ln -sf "$library" "$links/libcudnn.so"
    nvml=$(compgen -G "$cuda_home/lib64/stubs/libnvidia-ml.so" ||
           compgen -G "$cuda_home/targets/x86_64-linux/lib/stubs/libnvidia-ml.so" ||
           ldconfig -p 2> /dev/null | awk '$1 == "libnvidia-ml.so.1" {print $NF; exit}')
    [[ -n $nvml ]] && ln -sf "$nvml" "$links/libnvidia-ml.so"
    # The cuDNN frontend's own runtime-compiled engines call NVRTC (linked by name).
    ln -sf "$nvrtc/libnvrtc.so.$cuda_major" "$links/libnvrtc.so"
    if timeout "$(limit 240)" make -C "$llmc_build" train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 \
         NO_USE_MPI=1 PRECISION=BF16 CUDNN_FRONTEND_PATH=cudnn-frontend/include \
         NVCC_INCLUDES="-Icudnn-frontend/include -I$cudnn/include" \
         NVCC_LDLIBS="-L$links -lnvrtc" \
         > "$logs/llmc_build.log" 2>&1; then
      llmc_built=1
      say "llm.c built ($llmc_build/train_gpt2cu)"
    else
      say "llm.c's build failed (llmc_build.log):"
      grep -E "error" "$logs/llmc_build.log" | head -5
    fi
  else
    say "llm.c not built: not found: $gpu_libs_missing"
  fi
fi

# llm.c reads its tokens from a shard file (its format: a header of 256 int32, magic
# 20240520, version 1, the count; then uint16 tokens): random ones, enough for every step.
shard=$work/random_tokens.bin
if runs llmc; then
  python3 - "$shard" $(((steps + warmup + 2) * global_batch * seq + 1)) << 'EOF'
import random, struct, sys, array
path, count = sys.argv[1], int(sys.argv[2])
rng = random.Random(1234)
tokens = array.array("H", (rng.randrange(50257) for _ in range(count)))
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
    f.write(tokens.tobytes())
EOF
fi

# ---- runs ----------------------------------------------------------------------------------
rows=$logs/rows.jsonl  # this call's
: > "$rows"
# The GPU's memory in use now, in MiB.
baseline_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

# model trainer log command...: runs it under the time left while nvidia-smi samples the
# memory in use every 100 ms; records one line in $rows.
measure() {
  local model=$1 trainer=$2 log=$3
  shift 3
  local base sampler status
  base=$(baseline_mib)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$log.memory" &
  sampler=$!
  say "$model $trainer: $* (at most $(limit 240) s)"
  timeout --kill-after=10 "$(limit 240)" "$@" > "$log" 2>&1
  status=$?
  kill "$sampler" 2> /dev/null
  wait "$sampler" 2> /dev/null
  python3 "$root/scripts/bench_gpu_row.py" "$model" "$trainer" "$log" "$status" "$base" \
    "$warmup" "$global_batch" "$seq" >> "$rows"
  tail -1 "$rows"
}
not_built() { echo "{\"model\": \"$1\", \"trainer\": \"$2\", \"error\": \"not built\"}" >> "$rows"; }

declare -A layers=([124m]=12 [350m]=24 [1.5b]=48) hidden=([124m]=768 [350m]=1024 [1.5b]=1600)
declare -A heads=([124m]=12 [350m]=16 [1.5b]=25)
declare -A micro=([124m]=${BENCH_MICRO_124M:-16} [350m]=${BENCH_MICRO_350M:-8} [1.5b]=${BENCH_MICRO_1_5B:-4})
declare -A recompute=([124m]=none [350m]=none [1.5b]=${BENCH_RECOMPUTE_1_5B:-selective})
for model in $models; do
  [[ -n ${layers[$model]:-} ]] || { say "unknown model $model (124m, 350m, 1.5b)"; exit 2; }
  L=${layers[$model]} H=${hidden[$model]} NH=${heads[$model]} MB=${micro[$model]}
  for trainer in $trainers; do
    [[ $model == 1.5b && $trainer != trident ]] && continue
    log=$logs/$model-$trainer.log
    case $trainer in
      trident)
        ((trident_built)) || { not_built "$model" trident; continue; }
        measure "$model" trident "$log" "$TRIDENT_ENV" "$trident_build/trident" bench \
          --config "$root/configs/gpt2-124m.yaml" --set device=cuda \
          --set model.layers="$L" --set model.hidden="$H" --set model.heads="$NH" \
          --set model.ffn_hidden=$((4 * H)) --set model.seq_len=$seq \
          --set training.precision=bf16 --set training.micro_batch="$MB" \
          --set training.global_batch="$global_batch" \
          --set training.recompute="${recompute[$model]}" --steps "$steps" --warmup "$warmup"
        ;;
      llmc)
        ((llmc_built)) || { not_built "$model" llmc; continue; }
        # Random initialisation of the GPT-2 of L layers (its "dL" descriptor), AdamW as
        # Trident's, no evaluation or sampling but the one-batch validation llm.c always does
        # at the first and last step (outside the timed step).
        measure "$model" llmc "$log" env LD_LIBRARY_PATH="$gpu_lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
          bash -c "cd '$work' && '$llmc_build/train_gpt2cu' \
          -e d$L -i '$shard' -j '$shard' -b $MB -t $seq -d $((global_batch * seq)) \
          -x $((steps + warmup)) -v 1000000 -m 1 -s 0 -h 0 -l 6e-4 -u 0 -c 0.1 -z 0"
        ;;
      pytorch)
        measure "$model" pytorch "$log" python3 "$root/scripts/bench_gpt2_torch.py" \
          --layers "$L" --hidden "$H" --heads "$NH" --seq $seq --micro-batch "$MB" \
          --global-batch "$global_batch" --steps "$steps" --warmup "$warmup"
        ;;
      *) say "unknown trainer $trainer (trident, llmc, pytorch)"; exit 2 ;;
    esac
  done
done

# ---- every row, earlier calls' kept, and the table -----------------------------------------
python3 "$root/scripts/bench_gpu_row.py" --merge "$kept" "$rows" > "$out/bench_gpu.jsonl"
python3 "$root/scripts/bench_gpu_row.py" --table "$out/bench_gpu.jsonl" "$peak" "$seq" |
  tee "$out/bench_gpu.md"
failed=$(grep -c '"error"' "$rows")
pack_logs
say "done in $(($(date +%s) - started)) s; $failed of this call's runs gave no figure; results in $out"
((failed == 0))
