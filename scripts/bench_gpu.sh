#!/usr/bin/env bash
# GPT-2 training speed on one GPU, side by side, in one command: Trident (`trident bench`),
# llm.c's train_gpt2cu, and PyTorch (scripts/bench_gpt2_torch.py: torch.compile,
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
# What it needs beside the tree (ignored by git, so brought along explicitly):
#   .gpu-debs/        Trident's libraries, from scripts/gpu_fetch_debs.sh (as scripts/gpu_check.sh)
#   .gpu-src/llm.c/   llm.c and the cuDNN frontend headers, from scripts/gpu_fetch_llmc.sh
# and, on the GPU machine, nvcc, cmake, ninja, make, python3 with PyTorch, nvidia-smi.
# Trident is built by scripts/gpu_check.sh (TRIDENT_GPU_BUILD_ONLY=1), llm.c by its Makefile
# (bf16, cuDNN attention, one GPU), both under .gpu-work/ (ignored by git), where a later call
# on the same machine finds them built.
#
# Usage: scripts/bench_gpu.sh
# Environment: BENCH_MODELS (default "124m 350m 1.5b"), BENCH_TRAINERS (default
# "trident llmc pytorch"; 1.5b is Trident's alone), BENCH_GLOBAL_BATCH (sequences per step,
# default 64), BENCH_MICRO_124M / _350M / _1_5B (micro batches, default 16 / 8 / 4: raise them
# to the largest that fits), BENCH_RECOMPUTE_1_5B (Trident's training.recompute at 1.5B,
# default selective), BENCH_STEPS (timed, default 10), BENCH_WARMUP (untimed first, default
# 3), BENCH_PEAK (TFLOP/s, default 989), TRIDENT_BENCH_BUDGET (seconds for everything,
# default 570), TRIDENT_GPU_WORK (default .gpu-work).
# Output ($OUT when set, else .gpu-work/bench): bench_gpu.log, each run's log,
# bench_gpu.jsonl (a line per run) and bench_gpu.md (the table, also printed last). Exit
# status 0 when every run gave a figure, 1 otherwise, 2 when something it needs is missing.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${TRIDENT_GPU_WORK:-$root/.gpu-work}
out=${OUT:-$work/bench}
budget=${TRIDENT_BENCH_BUDGET:-570}
models=${BENCH_MODELS:-124m 350m 1.5b}
trainers=${BENCH_TRAINERS:-trident llmc pytorch}
global_batch=${BENCH_GLOBAL_BATCH:-64}
steps=${BENCH_STEPS:-10}
warmup=${BENCH_WARMUP:-3}
peak=${BENCH_PEAK:-989}
seq=1024
started=$(date +%s)
mkdir -p "$work" "$out"
exec > >(tee "$out/bench_gpu.log") 2>&1

say() { printf 'bench_gpu: %s\n' "$*"; }
left() { echo $((budget - ($(date +%s) - started))); }
limit() { local l; l=$(left); ((l > $1)) && l=$1; ((l < 1)) && l=1; echo "$l"; }
wants() { [[ " $trainers " == *" $1 "* ]]; }

for tool in nvidia-smi python3 make nvcc; do
  command -v "$tool" > /dev/null || { say "$tool not found"; exit 2; }
done
if wants llmc && [[ ! -f $root/.gpu-src/llm.c/train_gpt2.cu ]]; then
  say ".gpu-src/llm.c is missing: run scripts/gpu_fetch_llmc.sh and bring that folder"
  exit 2
fi
say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
say "nvcc: $(nvcc --version | sed -n 's/.*release //p')"
say "PyTorch: $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
[[ -f $root/.gpu-src/llm.c/SOURCES ]] && say "sources: $(tr '\n' ';' < "$root/.gpu-src/llm.c/SOURCES")"

# ---- builds: Trident, then llm.c against the cuDNN that Trident's build found ---------------
llmc_src=$root/.gpu-src/llm.c
llmc_built=0
trident_build=$work/trident/build
TRIDENT_GPU_BUILD_ONLY=1 TRIDENT_GPU_WORK=$work/trident TRIDENT_GPU_BUDGET=$(limit 330) \
  OUT=$out/trident_build "$root/scripts/gpu_check.sh" > "$out/trident_build.log" 2>&1
trident_status=$?
if ((trident_status == 0)); then
  # shellcheck source=/dev/null
  source "$work/trident/env.sh"
  say "Trident built ($trident_build/trident)"
else
  say "Trident's build failed ($out/trident_build.log):"
  tail -5 "$out/trident_build.log"
fi
if wants llmc && [[ -n ${TRIDENT_CUDNN_DIR:-} ]]; then
  # llm.c links Trident's cuDNN through a folder holding libcudnn.so (a wheel has only .so.9).
  links=$work/llmc-lib
  mkdir -p "$links"
  library=$(compgen -G "$TRIDENT_CUDNN_DIR/lib*/libcudnn.so*" | sort | head -1)
  [[ -z $library ]] && library=$(compgen -G "$TRIDENT_CUDNN_DIR/lib/x86_64-linux-gnu/libcudnn.so*" | sort | head -1)
  ln -sf "$library" "$links/libcudnn.so"
  # Command-line variables replace the Makefile's own, so these repeat what it would add.
  if timeout "$(limit 240)" make -C "$llmc_src" train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 \
       NO_USE_MPI=1 PRECISION=BF16 CUDNN_FRONTEND_PATH=cudnn-frontend/include \
       NVCC_INCLUDES="-Icudnn-frontend/include -I$TRIDENT_CUDNN_DIR/include" \
       NVCC_LDLIBS="-L$links" > "$out/llmc_build.log" 2>&1; then
    llmc_built=1
    say "llm.c built ($llmc_src/train_gpt2cu)"
  else
    say "llm.c's build failed ($out/llmc_build.log):"
    grep -E "error" "$out/llmc_build.log" | head -5
  fi
fi

# llm.c reads its tokens from a shard file (its format: a header of 256 int32, magic
# 20240520, version 1, the count; then uint16 tokens): random ones, enough for every step.
shard=$work/random_tokens.bin
python3 - "$shard" $(((steps + warmup + 2) * global_batch * seq + 1)) << 'EOF'
import random, struct, sys, array
path, count = sys.argv[1], int(sys.argv[2])
rng = random.Random(1234)
tokens = array.array("H", (rng.randrange(50257) for _ in range(count)))
with open(path, "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
    f.write(tokens.tobytes())
EOF

# ---- runs ----------------------------------------------------------------------------------
results=$out/bench_gpu.jsonl
: > "$results"
# The GPU's memory in use now, in MiB.
baseline_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }

# model trainer log command...: runs it under the time left while nvidia-smi samples the
# memory in use every 100 ms; records one line in $results.
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
  python3 - "$model" "$trainer" "$log" "$status" "$base" "$warmup" "$global_batch" "$seq" \
    >> "$results" << 'EOF'
import json, re, statistics, sys
model, trainer, log, status, base, warmup, batch, seq = sys.argv[1:]
text = open(log, errors="replace").read()
row = {"model": model, "trainer": trainer, "exit": int(status)}
try:
    used = [int(x) for x in open(log + ".memory").read().split() if x.isdigit()]
    row["peak_memory_mib"] = max(used) - int(base) if used else None
except OSError:
    row["peak_memory_mib"] = None
if trainer == "llmc":  # "step   4/13 | loss ... | 123.45 ms | ..." per step
    ms = [float(m) for m in re.findall(r"^step +\d+/\d+ \|.*?\| ([0-9.]+) ms \|", text, re.M)]
    timed = ms[int(warmup):]
    if timed:
        row["step_ms"] = statistics.median(timed)
        row["tokens_per_s"] = int(batch) * int(seq) / (row["step_ms"] / 1e3)
else:  # the last JSON line with tokens_per_s
    for line in reversed(text.splitlines()):
        if line.startswith("{") and "tokens_per_s" in line:
            own = json.loads(line)
            row["tokens_per_s"] = own["tokens_per_s"]
            row["step_ms"] = own.get("step_ms")
            row["own_peak_memory_bytes"] = own.get("peak_memory_bytes")
            break
if "tokens_per_s" not in row:
    row["error"] = "no figure (exit %s): see %s" % (status, log)
print(json.dumps(row))
EOF
  tail -1 "$results"
}

declare -A layers=([124m]=12 [350m]=24 [1.5b]=48) hidden=([124m]=768 [350m]=1024 [1.5b]=1600)
declare -A heads=([124m]=12 [350m]=16 [1.5b]=25)
declare -A micro=([124m]=${BENCH_MICRO_124M:-16} [350m]=${BENCH_MICRO_350M:-8} [1.5b]=${BENCH_MICRO_1_5B:-4})
declare -A recompute=([124m]=none [350m]=none [1.5b]=${BENCH_RECOMPUTE_1_5B:-selective})
for model in $models; do
  [[ -n ${layers[$model]:-} ]] || { say "unknown model $model (124m, 350m, 1.5b)"; exit 2; }
  L=${layers[$model]} H=${hidden[$model]} NH=${heads[$model]} MB=${micro[$model]}
  for trainer in $trainers; do
    [[ $model == 1.5b && $trainer != trident ]] && continue
    log=$out/$model-$trainer.log
    case $trainer in
      trident)
        ((trident_status == 0)) || { echo "{\"model\": \"$model\", \"trainer\": \"trident\", \"error\": \"not built\"}" >> "$results"; continue; }
        measure "$model" trident "$log" "$trident_build/trident" bench \
          --config "$root/configs/gpt2-124m.yaml" --set device=cuda \
          --set model.layers="$L" --set model.hidden="$H" --set model.heads="$NH" \
          --set model.ffn_hidden=$((4 * H)) --set model.seq_len=$seq \
          --set training.precision=bf16 --set training.micro_batch="$MB" \
          --set training.global_batch="$global_batch" \
          --set training.recompute="${recompute[$model]}" --steps "$steps" --warmup "$warmup"
        ;;
      llmc)
        ((llmc_built)) || { echo "{\"model\": \"$model\", \"trainer\": \"llmc\", \"error\": \"not built\"}" >> "$results"; continue; }
        # Random initialisation of the GPT-2 of L layers (its "dL" descriptor), AdamW as
        # Trident's, no evaluation or sampling but the one-batch validation llm.c always does
        # at the first and last step (outside the timed step).
        measure "$model" llmc "$log" bash -c "cd '$work' && '$llmc_src/train_gpt2cu' \
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

# ---- the table -----------------------------------------------------------------------------
python3 - "$results" "$peak" "$seq" << 'EOF' | tee "$out/bench_gpu.md"
import json, sys
path, peak, s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
shapes = {"124m": (12, 768), "350m": (24, 1024), "1.5b": (48, 1600)}
V = 50257
print("| model | trainer | tokens/s | model TFLOP/s | MFU | peak memory (MiB) |")
print("| --- | --- | --- | --- | --- | --- |")
failed = 0
for line in open(path):
    r = json.loads(line)
    L, h = shapes[r["model"]]
    if "tokens_per_s" not in r:
        failed += 1
        print(f"| {r['model']} | {r['trainer']} | — | — | — | {r.get('error', '')} |")
        continue
    per_token = 72 * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))  # Megatron's model FLOPs
    tflops = r["tokens_per_s"] * per_token / 1e12
    memory = r.get("peak_memory_mib")
    print(f"| {r['model']} | {r['trainer']} | {r['tokens_per_s']:.0f} | {tflops:.1f} | "
          f"{100 * tflops / peak:.1f}% | {memory if memory is not None else '—'} |")
sys.exit(1 if failed else 0)
EOF
status=${PIPESTATUS[0]}
say "done in $(($(date +%s) - started)) s; results in $out"
exit "$status"
