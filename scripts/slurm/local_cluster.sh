#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for trying and testing the batch scripts of
# scripts/slurm/: Debian's slurm-wlm (slurmctld + slurmd) and munge, all state, logs, sockets
# and the slurm.conf under one directory. No cgroups (proctrack/linuxproc, task/none), no
# accounting database, daemons as root: it works in a container. The node is this host, with
# the CPUs and memory that `slurmd -C` finds, reached at 127.0.0.1 (no DNS needed).
#
# Usage: scripts/slurm/local_cluster.sh start|stop|status [--dir DIR] [--port PORT]
#   start   write DIR/slurm.conf and a munge key, start munged, slurmctld and slurmd, and wait
#           until the node takes jobs; prints the line to export so that sbatch finds it
#   stop    end the daemons started in DIR (by the pids in DIR) and leave DIR for its logs
#   status  sinfo and squeue of the cluster in DIR
#   --dir   where everything lives (default /tmp/trident-slurm)
#   --port  slurmctld's port; slurmd takes PORT+1 (default 6817)
# Then: export SLURM_CONF=DIR/slurm.conf; sbatch ...
# Needs root and the packages slurm-wlm and munge (scripts/setup.sh --tests installs them).
set -euo pipefail

action=${1:-}
[[ $# -gt 0 ]] && shift
dir=/tmp/trident-slurm
port=6817
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "local_cluster: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case $action in start | stop | status) ;; *)
  echo "usage: $0 start|stop|status [--dir DIR] [--port PORT]" >&2; exit 2 ;;
esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/slurm.conf
export SLURM_CONF=$conf

# The pid in file $1 if that process is alive.
live_pid() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null && cat "$1"; }

stop() {
  local name pid
  for name in slurmd slurmctld munged; do
    pid=$(live_pid "$dir/$name.pid") || continue
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "local_cluster: stopped $name ($pid)"
  done
  rm -f "$dir"/*.pid
}

if [[ $action == stop ]]; then stop; exit 0; fi
if [[ $action == status ]]; then sinfo; squeue; exit 0; fi

for tool in munged mungekey slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || {
    echo "local_cluster: $tool not found: install Debian's slurm-wlm and munge" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "local_cluster: the daemons run as root here: run as root" >&2; exit 1; }
if live_pid "$dir/slurmctld.pid" >/dev/null; then
  echo "local_cluster: already running in $dir (stop it first)" >&2; exit 1
fi

mkdir -p "$dir/munge" "$dir/log" "$dir/ctld" "$dir/spool"
chmod 700 "$dir/munge"
[[ -f $dir/munge/munge.key ]] || mungekey --create --keyfile="$dir/munge/munge.key"
socket=$dir/munge/munge.socket
# --force: munged refuses directories that it finds insecure, e.g. one under /tmp.
# Each daemon's early errors (before its log file opens) go to DIR/log/NAME.err; no daemon
# keeps the caller's stdout open, so a caller that reads it (ctest) is not held up.
# Runs daemon $1 with arguments $2..., or fails with what it said.
start_daemon() {
  local name=$1
  shift
  "$@" </dev/null >"$dir/log/$name.err" 2>&1 || {
    echo "local_cluster: $name failed to start:" >&2; cat "$dir/log/$name.err" >&2; stop; exit 1; }
}
start_daemon munged munged --force --socket="$socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"

# e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
node=$(slurmd -C | head -n 1)
[[ $node == NodeName=* ]] || { echo "local_cluster: slurmd -C said: $node" >&2; stop; exit 1; }
host=${node#NodeName=}
host=${host%% *}
cat > "$conf" <<CONF
# A one-node cluster written by scripts/slurm/local_cluster.sh.
ClusterName=trident-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
# No cgroups: processes are tracked by their parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
# Finished jobs stay visible to scontrol for 10 minutes (there is no accounting database).
MinJobAge=600
MailProg=/bin/true
KillWait=10
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

# -i: forget jobs of an earlier cluster in the same directory.
start_daemon slurmctld slurmctld -i
start_daemon slurmd slurmd
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [[ $state == idle ]] && break
  sleep 0.5
done
if [[ ${state:-} != idle ]]; then
  echo "local_cluster: node $host is '${state:-unreachable}', not idle; logs in $dir/log:" >&2
  tail -n 5 "$dir"/log/*.log >&2 || true
  stop
  exit 1
fi
echo "local_cluster: node $host idle ($node)"
echo "export SLURM_CONF=$conf"
