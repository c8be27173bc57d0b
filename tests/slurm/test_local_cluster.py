#!/usr/bin/python3
"""The Slurm batch scripts on a real one-node Slurm cluster (scripts/slurm/local_cluster.sh).

Starts the cluster in a temporary directory and submits, with sbatch:
  - scripts/slurm/train_one_node.sbatch (srun --mpi=pmix), 2 ranks, parallel.data=2,
  - scripts/slurm/train_multi_node.sbatch (srun --mpi=pmix) on 1 node, parallel.pipeline=2, and
  - scripts/slurm/train_mpirun.sbatch (mpirun inside the allocation), 2 ranks, parallel.tensor=2,
each 10 steps of a tiny model on the CPU. Each job must complete with exit code 0, write its
log %x-%j.out and its run directory's metrics.jsonl with 10 step lines of finite losses, equal
to one process's losses within 1e-5 relative (so the ranks formed one world), and a checkpoint.
Then the preemption signal, with a stand-in for the binary that records the signals each rank
gets: Slurm's own `--signal=B:USR1@100` timer on a 2-minute job (srun script), and SIGUSR1 sent
to the batch shell with scancel (mpirun script); every rank must get SIGUSR1 exactly once.
Then the trainer itself signalled in a long 2-rank job: it must checkpoint after the step it is
in, say it was preempted and end the job with exit code 0, its checkpoint verifying. Then a
rank that dies (SIGKILL, through the test fault TRIDENT_TEST_FAIL_AT_STEP) in a job of each
launcher, srun --kill-on-bad-exit and mpirun: the job must fail within seconds of the death,
its log naming the dead rank (the time is printed). Finally the cluster is stopped and its
daemons must be gone.

Exit 77 (skipped, with the reason) where Slurm or munge is not installed, the test does not
run as root, or the cluster cannot start here.
"""
import argparse
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from mpi_harness import check, failures, losses, tiny_run  # noqa: E402

STEPS = 10
JOB_TIMEOUT_S = 240

# Stands in for trident: records the signals its rank gets, exits 0 on the first.
STUB = r"""#!/usr/bin/env bash
rank=${PMIX_RANK:-${OMPI_COMM_WORLD_RANK:-unknown}}
trap 'echo USR1 >> "$SIGNAL_DIR/rank$rank"; exit 0' USR1
trap 'echo TERM >> "$SIGNAL_DIR/rank$rank"; exit 0' TERM
touch "$SIGNAL_DIR/ready$rank"
for _ in $(seq 1500); do sleep 0.1; done
exit 3
"""


def skip(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(77)


def free_port_pair():
    """A port p with p and p+1 free (slurmctld and slurmd)."""
    for _ in range(100):
        p = random.randrange(20000, 40000)
        try:
            for q in (p, p + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise SystemExit("no free port pair found")


def job_fields(job_id, env):
    """scontrol's one-line record of the job as a dict ({} once the job is forgotten)."""
    p = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)


def wait_for_job(job_id, env, timeout_s=JOB_TIMEOUT_S):
    """Polls until the job has ended; cancels it on timeout. Returns its final fields."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fields = job_fields(job_id, env)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                      "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
                                      "DEADLINE"):
            return fields
        time.sleep(1)
    subprocess.run(["scancel", str(job_id)], env=env, timeout=30)
    print(f"job {job_id} still not done after {timeout_s} s: cancelled", flush=True)
    return job_fields(job_id, env)


def sbatch(args, env, cwd):
    p = subprocess.run(["sbatch", "--parsable"] + args, env=env, cwd=cwd, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if p.returncode != 0:
        raise SystemExit(f"sbatch failed: {p.stdout}")
    return int(p.stdout.strip().split(";")[0])


def show(path):
    if os.path.exists(path):
        with open(path) as f:
            print(f"--- {path}\n{f.read()}---", flush=True)


def check_training_job(name, job_id, fields, tmp, reference):
    ok = fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0"
    check(ok, f"{name}: job {job_id} {fields.get('JobState')}, exit code {fields.get('ExitCode')}")
    log = os.path.join(tmp, f"{name}-{job_id}.out")
    log_text = open(log).read() if os.path.exists(log) else ""
    check(f"done: {STEPS} steps" in log_text, f"{name}: the log {os.path.basename(log)} ends the run")
    run_dir = os.path.join(tmp, "runs", f"{name}-{job_id}")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = losses(metrics) if os.path.exists(metrics) else []
    check([r["step"] for r in rows] == list(range(1, STEPS + 1)),
          f"{name}: {len(rows)} step lines in runs/{name}-{job_id}/metrics.jsonl, {STEPS} expected")
    finite = all(math.isfinite(r["loss"]) for r in rows)
    check(bool(rows) and finite, f"{name}: finite losses")
    if rows and finite:
        worst = max(abs(r["loss"] - q["loss"]) / abs(q["loss"]) for r, q in zip(rows, reference))
        check(worst <= 1e-5, f"{name}: losses within 1e-5 of one process's (worst {worst:.2e})")
    check(os.path.isdir(os.path.join(run_dir, "checkpoints", f"step_{STEPS:06d}")),
          f"{name}: checkpoint in the run directory")
    if not ok:
        show(log)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--source-dir", required=True)
    a = parser.parse_args()
    for tool in ("sbatch", "scontrol", "scancel", "slurmctld", "slurmd", "munged"):
        if shutil.which(tool) is None:
            skip(f"{tool} not found: Slurm needs Debian's slurm-wlm and munge"
                 " (scripts/setup.sh --tests installs them)")
    if os.getuid() != 0:
        skip("the local cluster's daemons run as root; this test is not root")
    scripts = os.path.join(a.source_dir, "scripts", "slurm")
    cluster = os.path.join(scripts, "local_cluster.sh")

    with tempfile.TemporaryDirectory() as tmp:
        cluster_dir = os.path.join(tmp, "cluster")
        start = subprocess.run([cluster, "start", "--dir", cluster_dir, "--port",
                                str(free_port_pair())], text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=120)
        print(start.stdout, end="", flush=True)
        if start.returncode != 0:
            skip("the local Slurm cluster did not start here (its output is above)")
        env = dict(os.environ, SLURM_CONF=os.path.join(cluster_dir, "slurm.conf"),
                   TRIDENT=a.trident, TRIDENT_ROOT=a.source_dir,
                   TRIDENT_RUNS=os.path.join(tmp, "runs"))
        pids = {f[:-4]: open(os.path.join(cluster_dir, f)).read().strip()
                for f in os.listdir(cluster_dir) if f.endswith(".pid")}
        check(sorted(pids) == ["munged", "slurmctld", "slurmd"],
              f"start: pid files of munged, slurmctld and slurmd ({sorted(pids)})")
        try:
            run_jobs(a.trident, scripts, tmp, env)
        finally:
            subprocess.run([cluster, "stop", "--dir", cluster_dir], timeout=60)
        alive = [name for name, pid in pids.items() if os.path.exists(f"/proc/{pid}")]
        check(not alive, f"stop: no daemon left running ({alive})")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


def run_jobs(trident, scripts, tmp, env):
    # One process's losses: what every layout must give.
    config = tiny_run(tmp)
    reference_metrics = os.path.join(tmp, "one_process.jsonl")
    subprocess.run([trident, "train"] + config + ["--set", f"logging.metrics={reference_metrics}"],
                   check=True, stdout=subprocess.DEVNULL, timeout=300)
    reference = losses(reference_metrics)
    config_path = config[1]

    # The multi-node script on the one node there is (--nodes=1 over its default of 2).
    jobs = [("srun-pmix", "train_one_node.sbatch", [], "parallel.data=2"),
            ("multi-node", "train_multi_node.sbatch", ["--nodes=1"], "parallel.pipeline=2"),
            ("mpirun", "train_mpirun.sbatch", [], "parallel.tensor=2")]
    submitted = []
    for name, script, options, layout in jobs:
        job_id = sbatch([f"--job-name={name}", "--ntasks-per-node=2", "--time=10"] + options +
                        [os.path.join(scripts, script), config_path, "--set", layout], env, tmp)
        submitted.append((name, job_id))
    for name, job_id in submitted:
        t0 = time.monotonic()
        fields = wait_for_job(job_id, env)
        print(f"{name}: job {job_id} ended after {time.monotonic() - t0:.0f} s more", flush=True)
        check_training_job(name, job_id, fields, tmp, reference)

    # A job without a config fails at once, saying how to submit.
    job_id = sbatch(["--job-name=no-config", "--ntasks-per-node=2",
                     os.path.join(scripts, "train_one_node.sbatch")], env, tmp)
    fields = wait_for_job(job_id, env, timeout_s=60)
    log = os.path.join(tmp, f"no-config-{job_id}.out")
    text = open(log).read() if os.path.exists(log) else ""
    check(fields.get("JobState") == "FAILED" and "usage: sbatch" in text,
          f"no config: job {fields.get('JobState')}, the log says: {text.strip()}")

    # The preemption signal through each launcher, to a stand-in that records it.
    stub = os.path.join(tmp, "stub.sh")
    with open(stub, "w") as f:
        f.write(STUB)
    os.chmod(stub, 0o755)
    for name, script, how in [("signal-srun", "train_one_node.sbatch", "timer"),
                              ("signal-mpirun", "train_mpirun.sbatch", "scancel")]:
        signal_dir = os.path.join(tmp, name)
        os.makedirs(signal_dir)
        job_env = dict(env, TRIDENT=stub, SIGNAL_DIR=signal_dir)
        # The timer: a 2-minute job asking for SIGUSR1 100 s before its end, i.e. after 20 s
        # (slurmctld looks every 30 s or so); the stand-in is ready long before.
        extra = ["--time=2", "--signal=B:USR1@100"] if how == "timer" else ["--time=10"]
        job_id = sbatch([f"--job-name={name}", "--ntasks-per-node=2"] + extra +
                        [os.path.join(scripts, script), config_path], job_env, tmp)
        if how == "scancel":
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(
                    os.path.exists(os.path.join(signal_dir, f"ready{r}")) for r in (0, 1)):
                time.sleep(0.2)
            subprocess.run(["scancel", "--batch", "--signal=USR1", str(job_id)], env=env,
                           check=True, timeout=30)
        t0 = time.monotonic()
        fields = wait_for_job(job_id, env, timeout_s=150)
        print(f"{name}: job {job_id} ended after {time.monotonic() - t0:.0f} s", flush=True)
        got = {}
        for r in (0, 1):
            path = os.path.join(signal_dir, f"rank{r}")
            got[r] = open(path).read().split() if os.path.exists(path) else []
        ok = fields.get("JobState") == "COMPLETED" and all(got[r] == ["USR1"] for r in (0, 1))
        check(ok, f"{name} ({how}): each rank got SIGUSR1 once ({got}), job "
                  f"{fields.get('JobState')}")
        if not ok:
            show(os.path.join(tmp, f"{name}-{job_id}.out"))

    # Preemption for real: the trainer itself, signalled through the batch shell, checkpoints
    # after the step it is in, says so and ends the job cleanly; the checkpoint verifies.
    name = "preempted"
    job_id = sbatch([f"--job-name={name}", "--ntasks-per-node=2", "--time=10",
                     os.path.join(scripts, "train_mpirun.sbatch"), config_path,
                     "--set", "parallel.data=2", "--set", "training.steps=100000"], env, tmp)
    run_dir = os.path.join(tmp, "runs", f"{name}-{job_id}")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            os.path.exists(metrics) and len(open(metrics).readlines()) >= 3):
        time.sleep(0.5)
    subprocess.run(["scancel", "--batch", "--signal=USR1", str(job_id)], env=env, check=True,
                   timeout=30)
    fields = wait_for_job(job_id, env, timeout_s=150)
    log = os.path.join(tmp, f"{name}-{job_id}.out")
    text = open(log).read() if os.path.exists(log) else ""
    rows = losses(metrics) if os.path.exists(metrics) else []
    last = rows[-1]["step"] if rows else 0
    checkpoint = os.path.join(run_dir, "checkpoints", f"step_{last:06d}")
    check(fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0" and
          "preempted" in text and 3 <= last < 100000 and os.path.isdir(checkpoint),
          f"{name}: SIGUSR1 at step {last}: job {fields.get('JobState')} "
          f"{fields.get('ExitCode')}, checkpoint step_{last:06d} written")
    info = subprocess.run([trident, "checkpoint", "info", checkpoint], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    check(info.returncode == 0, f"{name}: `trident checkpoint info` verifies it")
    if fields.get("JobState") != "COMPLETED":
        show(log)

    # A rank that dies, as the kernel's out-of-memory killer or a node's failure kills it:
    # the launcher ends the job and says which rank it lost.
    for name, script, names_it in [
            ("dead-srun", "train_one_node.sbatch", "task 1: Killed"),
            ("dead-mpirun", "train_mpirun.sbatch", "process rank 1 with PID")]:
        job_env = dict(env, TRIDENT_TEST_FAIL_AT_STEP="5:1:kill")
        job_id = sbatch([f"--job-name={name}", "--ntasks-per-node=2", "--time=10",
                         os.path.join(scripts, script), config_path, "--set", "parallel.data=2",
                         "--set", "training.steps=100000"], job_env, tmp)
        log = os.path.join(tmp, f"{name}-{job_id}.out")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                os.path.exists(log) and "rank 1 fails at step 5" in open(log).read()):
            time.sleep(0.1)
        t0 = time.monotonic()
        fields = wait_for_job(job_id, env, timeout_s=120)
        seconds = time.monotonic() - t0
        text = open(log).read() if os.path.exists(log) else ""
        check(fields.get("JobState") == "FAILED" and seconds <= 15 and names_it in text,
              f"{name}: rank 1 killed at step 5: job {fields.get('JobState')} after "
              f"{seconds:.1f} s, the log says '{names_it}'")
        print(f"figure: dead rank (SIGKILL, {script}): {seconds:.1f} s from the death to the "
              f"end of the job (polled each second)", flush=True)
        if names_it not in text:
            show(log)


if __name__ == "__main__":
    sys.exit(main())
