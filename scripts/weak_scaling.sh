#!/usr/bin/env bash
# The weak-scaling series of the Megatron-LM paper (Shoeybi et al. 2019, Table 1 and Figure 5),
# scaled to the ranks there are: for M = 1, 2, 4, 8 tensor-parallel ranks the model grows
# with M so that the parameters per rank stay about constant (hidden size = heads x head size,
# heads 16, 20, 24, 32, layers 40, 54, 64, 72), and each size is timed with `trident bench`
# under mpirun. Per-rank TFLOP/s at M over that at the smallest M is the weak-scaling
# efficiency (the paper: 100, 95, 82, 77%).
#
# Families:
#   paper  the paper's sizes: head size 96 (hidden 1536 ... 3072), vocabulary 51200,
#          sequence 1024, batch 8: 1.2 to 8.3 billion parameters, for GPUs
#   cpu    the same rule, shrunk for a CPU: head size 16 (hidden 256, 320, 384, 512), layers
#          a tenth (4, 5, 6, 7), vocabulary 1024 and sequence 128 (so the embedding and the
#          attention keep the paper's share of the FLOPs), batch 8: 3.1, 3.1, 2.7, 2.8 M
#          parameters per rank, in the paper's proportions (1.2, 1.25, 1.05, 1.04 B)
#   auto   paper where nvidia-smi lists a GPU, else cpu (the default)
#
# Usage: scripts/weak_scaling.sh [--ranks 1,2,4] [--steps 5] [--warmup 2] [--out DIR]
#          [--mpirun "mpirun --oversubscribe"] [--family auto|cpu|paper] [--threads T]
#          [--data D] [--trident PATH] [--set key=value ...]
#   --ranks    tensor-parallel sizes M to run, each one of 1, 2, 4, 8 (default 1,2,4)
#   --steps    timed steps per size; the median is reported (default 5); --warmup untimed
#   --out      output directory (default runs/weak_scaling): weak_scaling.csv, .png, the
#              configs and each run's log
#   --mpirun   the launcher and its options (default: mpirun, with --oversubscribe for
#              Open MPI); ranks are M x D
#   --threads  CPU threads per rank (training.threads; default 1, so M ranks use M cores)
#   --data     data-parallel replicas D per size (default 1), the global batch growing with D
#              (the paper's model + data parallel series)
#   --set      passed on to `trident bench` (e.g. --set training.precision=bf16)
# The CSV and the plot are written by scripts/weak_scaling_report.py (python3-matplotlib).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ranks_list=1,2,4
steps=5
warmup=2
out=$root/runs/weak_scaling
mpirun=""
family=auto
threads=1
data=1
trident=$root/build/trident
extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --ranks) ranks_list=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --mpirun) mpirun=$2; shift 2 ;;
    --family) family=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --trident) trident=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "weak_scaling: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $trident ]] || { echo "weak_scaling: $trident not found; build first (scripts/setup.sh)" >&2; exit 1; }
if [[ $family == auto ]]; then
  family=cpu
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then family=paper; fi
fi
if [[ -z $mpirun ]]; then
  mpirun=mpirun
  mpirun --version 2>/dev/null | grep -q "Open MPI" && mpirun="mpirun --oversubscribe"
fi
read -r -a launcher <<< "$mpirun"
# Open MPI refuses root unless told; containers often run as root.
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# The paper's Table 1: M -> heads, layers, billions of parameters, weak-scaling efficiency %.
declare -A paper_heads=([1]=16 [2]=20 [4]=24 [8]=32)
declare -A paper_layers=([1]=40 [2]=54 [4]=64 [8]=72)
declare -A paper_billions=([1]=1.2 [2]=2.5 [4]=4.2 [8]=8.3)
declare -A paper_efficiency=([1]=100 [2]=95 [4]=82 [8]=77)
case $family in
  paper) head_size=96 vocab=51200 seq=1024 micro_batch=8 device=auto ;;
  cpu) head_size=16 vocab=1024 seq=128 micro_batch=8 device=cpu ;;
  *) echo "weak_scaling: --family is auto, cpu or paper" >&2; exit 2 ;;
esac

IFS=, read -r -a ranks <<< "$ranks_list"
for m in "${ranks[@]}"; do
  [[ -n ${paper_heads[$m]:-} ]] || { echo "weak_scaling: M = $m is not in the series (1, 2, 4, 8)" >&2; exit 2; }
done
mkdir -p "$out"
results=$out/results.jsonl
: > "$results"
echo "weak_scaling: family $family, M = ${ranks[*]}, D = $data, $steps steps, $(nproc) cores here"
for m in "${ranks[@]}"; do
  heads=${paper_heads[$m]}
  layers=${paper_layers[$m]}
  [[ $family == cpu ]] && layers=$(( (layers + 5) / 10 ))
  hidden=$((heads * head_size))
  config=$out/m$m.yaml
  cat > "$config" <<CONF
# Weak-scaling point M = $m ($family family), written by scripts/weak_scaling.sh.
model: {vocab_size: $vocab, seq_len: $seq, layers: $layers, hidden: $hidden, heads: $heads,
        ffn_hidden: $((4 * hidden))}
parallel: {tensor: $m, data: $data}
training: {micro_batch: $micro_batch, global_batch: $((micro_batch * data)), threads: $threads}
device: $device
CONF
  world=$((m * data))
  log=$out/m$m.log
  echo "== M = $m: hidden $hidden, heads $heads, layers $layers, $world ranks"
  if ! "${launcher[@]}" -np "$world" "$trident" bench --config "$config" --steps "$steps" \
       --warmup "$warmup" ${extra[@]+"${extra[@]}"} > "$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "weak_scaling: M = $m failed; its log is $log" >&2
    exit 1
  fi
  line=$(tail -n 1 "$log")
  [[ $line == "{"* ]] || { echo "weak_scaling: no JSON line at the end of $log" >&2; exit 1; }
  echo "$line"
  # The bench line with the point's sizes and the paper's figures added.
  echo "${line%\}}, \"tensor\": $m, \"data\": $data, \"hidden\": $hidden, \"heads\": $heads, \"layers\": $layers, \"family\": \"$family\", \"paper_hidden\": $((heads * 96)), \"paper_layers\": ${paper_layers[$m]}, \"paper_params_billion\": ${paper_billions[$m]}, \"paper_efficiency_pct\": ${paper_efficiency[$m]}, \"cores\": $(nproc)}" >> "$results"
done
/usr/bin/python3 "$root/scripts/weak_scaling_report.py" "$results" --csv "$out/weak_scaling.csv" \
  --png "$out/weak_scaling.png"
