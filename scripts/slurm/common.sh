# shellcheck shell=bash
# What the batch scripts of scripts/slurm/ share, sourced by them inside the allocation:
# the per-job run directory, the trainer's command line, and a launcher that passes the
# preemption signal on to every rank.
#
# The signal: each batch script asks Slurm for `--signal=B:USR1@120`, SIGUSR1 to the batch
# shell 120 s before the time limit (Slurm may send it up to a minute late). The shell runs
# the launcher (srun or mpirun) in the background and forwards SIGUSR1 and SIGTERM to it;
# srun and mpirun pass both on to every rank, where the trainer writes a checkpoint and stops.
# Without B:, Slurm would signal the job's steps itself and the batch shell not at all; with
# B: there is exactly one path, shell -> launcher -> ranks, whichever launcher it is.
#
# Environment the scripts read (all optional):
#   TRIDENT_ROOT  the repository (default: the directory sbatch was called from)
#   TRIDENT       the binary (default: $TRIDENT_ROOT/build/trident)
#   TRIDENT_RUNS  where run directories go (default: $SLURM_SUBMIT_DIR/runs)

# A signal that comes before the launcher runs (a time limit under 120 s) is kept for it.
trident_slurm_pending=()
trap 'trident_slurm_pending+=(USR1)' USR1
trap 'trident_slurm_pending+=(TERM)' TERM

# Checks the allocation and arguments and sets: trident, run_dir, train_args (an array: the
# trainer's arguments), srun_gpu_options (an array, for srun). $1 is the config, the rest go to `trident train` after the run
# directory's settings, so a --set given there overrides them.
trident_slurm_prepare() {
  if [[ $# -lt 1 || $1 == -* ]]; then
    echo "trident-slurm: usage: sbatch [options] SCRIPT CONFIG [--set key=value ...]" >&2
    return 2
  fi
  local config=$1
  shift
  trident=${TRIDENT:-$TRIDENT_ROOT/build/trident}
  [[ -x $trident ]] || { echo "trident-slurm: $trident is not an executable; build first" \
                               "(scripts/setup.sh) or set TRIDENT" >&2; return 1; }
  [[ -f $config ]] || { echo "trident-slurm: config '$config' not found (relative paths are" \
                              "from $SLURM_SUBMIT_DIR)" >&2; return 1; }

  # One rank per GPU: the binary takes GPU number = its local rank, so every rank must see all
  # of its node's GPUs (no --gpus-per-task, no per-rank CUDA_VISIBLE_DEVICES).
  local tasks_per_node=${SLURM_NTASKS_PER_NODE:-}
  local gpus_per_node=${SLURM_GPUS_PER_NODE:-}
  gpus_per_node=${gpus_per_node##*:}  # "a100:8" -> "8"
  if [[ -n $gpus_per_node && -n $tasks_per_node && $gpus_per_node != "$tasks_per_node" ]]; then
    echo "trident-slurm: $tasks_per_node tasks but $gpus_per_node GPUs per node: ask for" \
         "--ntasks-per-node=G --gpus-per-node=G, one rank per GPU" >&2
    return 1
  fi

  # srun's options for the GPUs: no binding, whatever a site's defaults ask for.
  # shellcheck disable=SC2034  # read by the batch scripts
  srun_gpu_options=()
  if [[ -n $gpus_per_node ]]; then srun_gpu_options+=(--gpu-bind=none); fi

  run_dir=${TRIDENT_RUNS:-$SLURM_SUBMIT_DIR/runs}/$SLURM_JOB_NAME-$SLURM_JOB_ID
  mkdir -p "$run_dir"
  cp "$config" "$run_dir/config.yaml"
  printf '%q ' "$trident" train --config "$config" "$@" > "$run_dir/command.txt"
  echo >> "$run_dir/command.txt"

  train_args=(train --config "$config"
              --set "logging.metrics=$run_dir/metrics.jsonl"
              --set "checkpoint.dir=$run_dir/checkpoints")
  # srun no longer inherits sbatch's --cpus-per-task (Slurm 22.05 and later): pass it on.
  if [[ -n ${SLURM_CPUS_PER_TASK:-} ]]; then
    export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
    train_args+=(--set "training.threads=$SLURM_CPUS_PER_TASK")
  fi
  train_args+=("$@")

  echo "trident-slurm: job $SLURM_JOB_ID ($SLURM_JOB_NAME) on ${SLURM_JOB_NUM_NODES:-1} node(s)" \
       "[$SLURM_JOB_NODELIST], ${SLURM_NTASKS:-?} ranks, ${gpus_per_node:-no} GPUs per node"
  echo "trident-slurm: run directory $run_dir"
}

# Runs the launcher command "$@" in the background, forwards SIGUSR1 and SIGTERM to it, and
# returns its exit status once it has ended.
trident_slurm_launch() {
  echo "trident-slurm: $*"
  "$@" &
  local pid=$!
  # shellcheck disable=SC2064  # the pid is fixed now
  trap "echo 'trident-slurm: SIGUSR1: passing it on to the ranks'; kill -USR1 $pid 2>/dev/null" USR1
  # shellcheck disable=SC2064
  trap "echo 'trident-slurm: SIGTERM: passing it on to the ranks'; kill -TERM $pid 2>/dev/null" TERM
  local signal
  for signal in "${trident_slurm_pending[@]}"; do kill -s "$signal" "$$"; done
  # A trapped signal ends `wait` early (status > 128) while the launcher still runs: wait again.
  while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
  local status=0
  wait "$pid" || status=$?
  trap - USR1 TERM
  echo "trident-slurm: launcher exited with status $status"
  return "$status"
}
