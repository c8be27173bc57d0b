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
# It runs inside scripts/gpu_verify.sh's speed phases, with the binaries of the bundle
# (scripts/gpu_bundle.sh): nothing is compiled on the GPU machine. Rows measured by earlier
# phases or calls are kept: the rows of BENCH_RESULTS are merged with this call's, a row
# measured again replacing the old one, and the table is of them all.
#
# Usage: scripts/bench_gpu.sh
# Environment: TRIDENT_ENV (a command that runs its arguments as Trident's processes run:
# gpu_verify.sh's trident-env) and TRIDENT_BIN (the trident binary), for Trident's runs;
# LLMC_BIN (llm.c's train_gpt2cu, run through TRIDENT_ENV), for llm.c's; BENCH_MODELS (default
# "124m 350m 1.5b"), BENCH_TRAINERS (default "trident llmc pytorch"; pytorch-eager is PyTorch
# without torch.compile; 1.5b is Trident's alone), BENCH_RESULTS (rows to keep, default
# .gpu-work/bench_gpu.jsonl), BENCH_GLOBAL_BATCH (sequences per step, default 64),
# BENCH_MICRO_124M / _350M / _1_5B (micro batches, default 16 / 8 / 4: raise them to the
# largest that fits), BENCH_RECOMPUTE_1_5B (Trident's training.recompute at 1.5B, default
# selective), BENCH_STEPS (timed, default 10), BENCH_WARMUP (untimed first, default 3),
# BENCH_PEAK (TFLOP/s, default 989), TRIDENT_BENCH_BUDGET (seconds for everything, default
# 570), TRIDENT_GPU_WORK (default .gpu-work).
# Output ($OUT when set, else .gpu-work/bench), four files: bench_gpu.log (this output),
# bench_gpu.jsonl (every row, a line each), bench_gpu.md (the table, also printed last) and
# bench_logs.tar.gz (every run's log). Exit status 0 when every run of this call gave a
# figure, 1 otherwise, 2 when something it needs is missing.
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

for tool in nvidia-smi python3; do
  command -v "$tool" > /dev/null || { say "$tool not found"; exit 2; }
done
trident_built=0 llmc_built=0
if runs trident; then
  [[ -x ${TRIDENT_BIN:-} && -x ${TRIDENT_ENV:-} ]] && trident_built=1 ||
    say "TRIDENT_BIN and TRIDENT_ENV name no programs: Trident's rows say 'not built'"
fi
if runs llmc; then
  [[ -x ${LLMC_BIN:-} && -x ${TRIDENT_ENV:-} ]] && llmc_built=1 ||
    say "LLMC_BIN names no program: llm.c's rows say 'not built'"
fi
say "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
runs pytorch && say "PyTorch: $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)"
say "this call: trainers $trainers; models $models; rows kept from $kept"

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
        measure "$model" trident "$log" "$TRIDENT_ENV" "$TRIDENT_BIN" bench \
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
        measure "$model" llmc "$log" "$TRIDENT_ENV" bash -c "cd '$work' && '$LLMC_BIN' \
          -e d$L -i '$shard' -j '$shard' -b $MB -t $seq -d $((global_batch * seq)) \
          -x $((steps + warmup)) -v 1000000 -m 1 -s 0 -h 0 -l 6e-4 -u 0 -c 0.1 -z 0"
        ;;
      pytorch | pytorch-eager)
        measure "$model" "$trainer" "$log" python3 "$root/scripts/bench_gpt2_torch.py" \
          --layers "$L" --hidden "$H" --heads "$NH" --seq $seq --micro-batch "$MB" \
          --global-batch "$global_batch" --steps "$steps" --warmup "$warmup" \
          $([[ $trainer == pytorch-eager ]] && echo --no-compile)
        ;;
      *) say "unknown trainer $trainer (trident, llmc, pytorch, pytorch-eager)"; exit 2 ;;
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
