"""Faults of multi-rank runs under mpirun, and how promptly and clearly each ends the job; one
fault per run (--fault NAME, each its own ctest entry mpi.faults.NAME):

- a stalled rank (SIGSTOP) on 2x1x1, 1x2x1 and 1x1x2 with training.collective_timeout 5 s:
  every process gone within 5 s + slack, non-zero exit, and a waiting rank's line naming the
  call, its group and the stopped rank with its coordinates (the stopped rank blames nobody);
- a dead rank: SIGKILL from outside, and one rank alone throwing an error or running out of
  memory (the test fault TRIDENT_TEST_FAIL_AT_STEP): ended promptly, the dead rank named;
- a full disk in a checkpoint save of rank 1's shard (TRIDENT_TEST_WRITE_ERROR): one line from
  rank 0 naming the file and the errno, exit 1, no MPI_Abort, only complete checkpoints left,
  and the job resumes from the previous one with the uninterrupted run's losses; with
  checkpoint.on_error: continue it saves again at the next interval and finishes;
- the metrics file on a full disk (ENOSPC injected: /dev/full itself is refused as no regular
  file) and a trace that cannot be written: one clear line and exit 1, on every rank together;
- a training file truncated between a checkpoint and its resume: named, and the resume stops;
  one rewritten in place with the same size under the job: the first batch that reads it ends
  the job, naming the file, the byte and the id;
- a NaN planted in one rank's gradients: the update skipped on every rank, the rank and its
  stage named; NaNs in a row: the run stops at training.max_skipped, its checkpoints kept;
- a bit flipped in one replica's weight: the replica check names the rank and the tensor;
- a rank slowed in every step (TRIDENT_TEST_SLOW_RANK): named as a straggler with its host;
- asynchronous checkpoints: the same files as synchronous ones; a rank killed while it writes
  in the background leaves the previous checkpoint, which the job resumes from.

Each figure (seconds from the fault to the end of the job) is printed for docs/RELIABILITY.md.
Exit 77 (skipped, with the reason) where mpirun is not installed.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mpi_harness as h  # noqa: E402

TIMEOUT_S = 5
SLACK_S = 5


def wait_for_lines(path, n, job, limit_s=120):
    deadline = time.monotonic() + limit_s
    while job.poll() is None and time.monotonic() < deadline:
        if os.path.exists(path) and len(open(path).readlines()) >= n:
            return True
        time.sleep(0.05)
    return False


def gone_or_left(config, deadline):
    """The job's processes still alive at `deadline` (a monotonic time), or none as soon as
    all are gone: mpirun may end a moment before the kill it sent a stopped rank has landed."""
    left = h.trident_pids(config)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = h.trident_pids(config)
    return left


def finish(job, config, limit_s):
    """The job's output and exit code once it ends, or after limit_s; what is left of it is
    killed then (a hang), and the code is None."""
    try:
        out, _ = job.communicate(timeout=limit_s)
        return out, job.returncode
    except subprocess.TimeoutExpired:
        for pid in h.trident_pids(config).values():
            os.kill(pid, signal.SIGKILL)
        job.kill()
        out, _ = job.communicate()
        return out, None


def entries_of(directory):
    """The names in a checkpoint.dir, less the run's lock file."""
    return sorted(e for e in os.listdir(directory) if e != ".lock")


def coordinates(p, m, d, rank):
    tp, dp, pp = rank % m, (rank // m) % d, rank // (m * d)
    return f"rank {rank} (pp {pp}, tp {tp}, dp {dp})"


def error_lines(out):
    return [line for line in out.splitlines() if line.startswith("trident: error:")]


def layout(p, m, d):
    return [f"parallel.pipeline={p}", f"parallel.tensor={m}", f"parallel.data={d}"]


def stalled_rank(trident, base, config, tmp, p, m, d):
    name = f"{p}x{m}x{d}"
    metrics = os.path.join(tmp, f"stall_{name}.jsonl")
    job = h.start_train(trident, base, p * m * d, layout(p, m, d) + [
        "training.steps=1000000", f"training.collective_timeout={TIMEOUT_S}",
        "logging.interval=100000", f"logging.metrics={metrics}"])
    if not wait_for_lines(metrics, 3, job):
        out, _ = finish(job, config, 30)
        h.check(False, f"stall {name}: the job did not start training\n{out}")
        return
    pids = h.trident_pids(config)
    stopped = max(pids)
    os.kill(pids[stopped], signal.SIGSTOP)
    t0 = time.monotonic()
    out, code = finish(job, config, TIMEOUT_S + 30)
    left = gone_or_left(config, t0 + TIMEOUT_S + SLACK_S)
    seconds = time.monotonic() - t0
    for pid in left.values():
        os.kill(pid, signal.SIGKILL)
    lines = error_lines(out)
    victim = coordinates(p, m, d, stopped)
    # The groups the stopped rank shares with a waiting one, and what that one may wait in.
    groups = {"2x1x1": "pipeline|embedding|world", "1x2x1": "tensor|world",
              "1x1x2": "data|world"}[name]
    pattern = (r"trident: error: rank \d+ \(pp \d+, tp \d+, dp \d+\): stalled \d+\.\d s in "
               r"(all_reduce|reduce_scatter|all_gather|broadcast|send|recv|barrier)[a-z ()-]* "
               rf"on the ({groups}) group \(ranks .*\) .*waiting on {re.escape(victim)}; "
               rf"training.collective_timeout is {TIMEOUT_S}.0 s: aborting the job")
    named = [line for line in lines if re.fullmatch(pattern, line)]
    h.check(code not in (None, 0) and not left and seconds <= TIMEOUT_S + SLACK_S,
            f"stall {name}: rank {stopped} stopped, every process gone after {seconds:.1f} s "
            f"(limit {TIMEOUT_S} + {SLACK_S}), exit code {code}")
    h.check(bool(named) and not any(line.startswith(f"trident: error: {victim}")
                                    for line in lines),
            f"stall {name}: a waiting rank names the call, its group and {victim}: {lines}")
    print(f"figure: stall {name}: {seconds:.1f} s from SIGSTOP to the end of the job", flush=True)
    if not named:
        print(out[-3000:])


def dead_rank(trident, base, config, tmp, how):
    metrics = os.path.join(tmp, f"dead_{how}.jsonl")
    env = {} if how == "sigkill" else {"TRIDENT_TEST_FAIL_AT_STEP": f"4:1:{how}"}
    job = h.start_train(trident, base, 2, layout(1, 1, 2) + [
        "training.steps=1000000", "logging.interval=100000", f"logging.metrics={metrics}"], env)
    if how == "sigkill":
        if wait_for_lines(metrics, 3, job):
            os.kill(h.trident_pids(config)[1], signal.SIGKILL)
    else:
        wait_for_lines(metrics, 3, job)
    t0 = time.monotonic()
    out, code = finish(job, config, 60)
    seconds = time.monotonic() - t0
    expected = {
        "sigkill": "mpirun noticed that process rank 1 with PID",
        "error": "trident: error: rank 1: TRIDENT_TEST_FAIL_AT_STEP: a failure of this rank alone",
        "oom": "trident: error: rank 1: out of memory: an allocation failed (std::bad_alloc) at "
               "step 4",
    }[how]
    h.check(code not in (None, 0) and not gone_or_left(config, time.monotonic() + SLACK_S)
            and expected in out,
            f"dead rank ({how}): the job ended (exit code {code}) and says '{expected}'")
    if expected not in out:
        print(out[-3000:])
    h.check(seconds <= 10, f"dead rank ({how}): ended {seconds:.1f} s after the "
            + ("kill" if how == "sigkill" else "third step"))
    print(f"figure: dead rank ({how}, mpirun): {seconds:.1f} s from the "
          + ("kill" if how == "sigkill" else "end of step 3 (the fault is in step 4)")
          + " to the end of the job", flush=True)


def full_disk(trident, base, tmp, ref):
    ck = os.path.join(tmp, "ck_full")
    args = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
    for o in layout(1, 1, 2) + ["training.steps=8", "checkpoint.interval=2",
                                f"checkpoint.dir={ck}"]:
        args += ["--set", o]
    env = {**h.mpirun_env(), "TRIDENT_TEST_WRITE_ERROR": "step_000004/pp0_tp0_dp1:ENOSPC"}
    t0 = time.monotonic()
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=300)
    lines = error_lines(p.stdout)
    expected = (f"trident: error: checkpoint {ck}/step_000004 not saved: {ck}/.tmp_step_000004/"
                f"pp0_tp0_dp1.safetensors: cannot write: No space left on device (ENOSPC); "
                f"{ck}/step_000002 is the newest checkpoint, as it was (checkpoint.on_error: stop)")
    h.check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout,
            f"full disk: one line from rank 0 and exit code 1 (got {p.returncode}): {lines}")
    # (beside it the metrics, logging.metrics' default)
    h.check(entries_of(ck) == ["metrics.jsonl", "step_000002"],
            f"full disk: only the complete checkpoint is left ({entries_of(ck)})")
    print(f"figure: full disk, stop: the job ended {time.monotonic() - t0:.1f} s after it "
          f"started (the save of step 4 failed)", flush=True)
    metrics = os.path.join(tmp, "full_resumed.jsonl")
    r = h.run(args + ["--set", f"logging.metrics={metrics}"], ranks=None)
    h.check(f"resumed: {ck}/step_000002 at step 2" in r.stdout,
            "full disk: the job resumes from the checkpoint before the failed save")
    got = [x["loss"] for x in h.losses(metrics)]
    h.check(len(got) == 6 and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, ref[2:])),
            f"full disk: the resumed job gives the uninterrupted losses ({got} vs {ref[2:]})")

    ck2 = os.path.join(tmp, "ck_continue")
    args2 = [a.replace(ck, ck2) for a in args] + ["--set", "checkpoint.on_error=continue"]
    p = subprocess.run(args2, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=300)
    warnings = [line for line in p.stdout.splitlines() if line.startswith("trident: warning:")]
    h.check(p.returncode == 0 and len(warnings) == 1 and "saves again at step 6" in warnings[0]
            and entries_of(ck2) == ["metrics.jsonl", "step_000002", "step_000006",
                                             "step_000008"],
            f"full disk, continue: one warning, the job finishes (exit code {p.returncode}) and "
            f"saves at steps 6 and 8 ({entries_of(ck2)})")
    h.check(h.run([trident, "checkpoint", "info", ck2], expect_ok=False).returncode == 0,
            "full disk, continue: the newest checkpoint verifies")


def logging_failures(trident, base, tmp):
    for what, overrides, env, expected in [
            ("metrics", [f"logging.metrics={tmp}/m.jsonl"],
             {"TRIDENT_TEST_WRITE_ERROR": "m.jsonl:ENOSPC"},
             f"trident: error: logging.metrics: {tmp}/m.jsonl: cannot write: No space left on "
             "device (ENOSPC) (logging.on_error: stop); checkpoint.dir is not set"),
            ("trace", [f"logging.trace={tmp}/trace.json"],
             {"TRIDENT_TEST_WRITE_ERROR": "trace.json:EIO"},
             f"trident: error: logging.trace: {tmp}/trace.json: cannot write: Input/output error "
             f"(EIO) (logging.on_error: stop; training itself is done)")]:
        args = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
        for o in layout(2, 1, 1) + ["training.steps=3"] + overrides:
            args += ["--set", o]
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**h.mpirun_env(), **env}, timeout=300)
        lines = error_lines(p.stdout)
        h.check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout,
                f"{what} on a failing disk: one line, exit code 1 (got {p.returncode}): {lines}")


def changed_data(trident, base, tmp):
    ck = os.path.join(tmp, "ck_data")
    common = layout(1, 1, 2) + [f"checkpoint.dir={ck}", "checkpoint.interval=2"]
    args = [trident, "train"] + base
    for o in common + ["training.steps=2"]:
        args += ["--set", o]
    h.run(args, ranks=2)
    data = os.path.join(tmp, "train.bin")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 200)
        f.seek(8)
        f.write((2900).to_bytes(4, "little"))  # the header's token count, to match
    p = h.run(args[:-1] + ["training.steps=4"], ranks=2, expect_ok=False)
    lines = error_lines(p.stdout)
    h.check(p.returncode == 1 and len(lines) == 1 and f"data.train: {data}: 6824 bytes now, "
            "7024 then (truncated or replaced)" in lines[0],
            f"changed data: the resume stops, naming the file ({lines})")
    rewritten_in_place(trident, base, tmp)


def rewritten_in_place(trident, base, tmp):
    """The data rewritten in place under a 1x1x2 job, every token byte 0xFF and the size kept
    (neither the size nor a resume's fingerprint would be asked): the next batch read stops the
    job, naming the file, the byte and the id."""
    data = os.path.join(tmp, "inplace.bin")
    shutil.copy(os.path.join(tmp, "train.bin"), data)
    metrics = os.path.join(tmp, "inplace.jsonl")
    cmd = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
    for o in layout(1, 1, 2) + [f"data.train={data}", "training.steps=100000000",
                                f"logging.metrics={metrics}"]:
        cmd += ["--set", o]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=h.mpirun_env())
    if wait_for_lines(metrics, 2, job):
        size = os.path.getsize(data)
        with open(data, "r+b") as f:
            f.seek(1024)
            f.write(b"\xff" * (size - 1024))
    out, code = finish(job, base[1], 60)
    lines = error_lines(out)
    h.check(code not in (None, 0) and bool(lines) and all(
        f"data.train: {data}: token id 65535 at byte " in line and
        "the file changed while this run read it" in line for line in lines),
        f"data rewritten in place, same size: the job ends (exit code {code}), naming the file, "
        f"the byte and the id: {lines}")


def rank_pid(config, rank, limit_s=60):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        pids = h.trident_pids(config)
        if rank in pids:
            return pids[rank]
        time.sleep(0.05)
    return None


def dead_rank_no_abort(trident, base, config, tmp):
    """SIGKILL to rank 1 of 1x1x2 under a launcher that does not end the job: each rank runs
    inside a shell that outlives it (as a wrapper script or a launcher without failure
    detection would), so mpirun sees no rank die. Rank 0 waits in a collective on the dead
    rank until its watchdog ends the job at training.collective_timeout."""
    metrics = os.path.join(tmp, "noabort.jsonl")
    wrapper = 'run() { "$@"; echo "wrapper: trident exited $?" >&2; sleep 300; }; run "$@"'
    cmd = ["mpirun", "--oversubscribe", "-np", "2", "sh", "-c", wrapper, "sh", trident, "train"]
    cmd += base
    for o in layout(1, 1, 2) + ["training.steps=1000000", "logging.interval=100000",
                                f"logging.metrics={metrics}", "training.collective_timeout=5"]:
        cmd += ["--set", o]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=h.mpirun_env())
    if wait_for_lines(metrics, 3, job):
        os.kill(rank_pid(config, 1), signal.SIGKILL)
    t0 = time.monotonic()
    out, code = finish(job, config, 60)
    seconds = time.monotonic() - t0
    lines = error_lines(out)
    # Rank 0 waits in whichever collective of the step the kill caught: the data group's
    # gradient reduction or one of the world's per-step agreements.
    named = [line for line in lines if line.startswith("trident: error: rank 0 (pp 0, tp 0, dp 0): "
                                                       "stalled ") and
             "waiting on rank 1 (pp 0, tp 0, dp 1)" in line]
    h.check(code not in (None, 0) and not gone_or_left(config, time.monotonic() + SLACK_S)
            and bool(named),
            f"dead rank, launcher not aborting: rank 0's watchdog ended the job (exit code {code}), "
            f"naming rank 1: {lines}")
    h.check(5 <= seconds <= 15, f"dead rank, launcher not aborting: ended {seconds:.1f} s after "
                                f"the kill (timeout 5 s)")
    if not named:
        print(out[-3000:])
    print(f"figure: dead rank (SIGKILL, launcher not aborting): {seconds:.1f} s from the kill "
          f"to the end of the job", flush=True)


def real_oom(trident, base, config, tmp):
    """A real out-of-memory: the job's address space capped with ulimit -v (1.5 GB a
    process) under a model whose buffers need more (hidden 1024, 8 layers: 0.4 GB of
    weights alone on each rank). Every allocation is a real one that fails; the job ends with
    one rank's line naming the allocation, promptly."""
    overrides = layout(1, 1, 2) + ["model.hidden=1024", "model.layers=8", "model.heads=8",
                                   "model.ffn_hidden=4096", "training.steps=2"]
    cmd = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", 'ulimit -v 1500000 && exec "$@"', "bash"] + cmd,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=h.mpirun_env(), timeout=120)
    seconds = time.monotonic() - t0
    lines = error_lines(p.stdout)
    # The line cites the allocator by its path in the repository, not the build's.
    oom = [line for line in lines if re.match(
        r"trident: error: rank [01]: kernels/cpu/cpu_ops\.cpp:\d+: out of host memory "
        r"allocating \d+ bytes", line)]
    h.check(p.returncode not in (None, 0)
            and not gone_or_left(config, time.monotonic() + SLACK_S) and bool(oom),
            f"out of memory (ulimit -v): the job ended (exit code {p.returncode}) with a rank's "
            f"line naming the allocation: {lines}")
    if not oom:
        print(p.stdout[-3000:])
    print(f"figure: out of memory (ulimit -v 1.5 GB): the job ended {seconds:.1f} s after it "
          f"started", flush=True)


def real_full_disk(trident, base, config, tmp):
    """A real full disk: checkpoint.dir on a tmpfs of 1 MiB (mounted here: CI runs as root),
    filled by the run's own checkpoints until a save finds no room."""
    mount = os.path.join(tmp, "small")
    os.makedirs(mount)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mount],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    h.check(r.returncode == 0, f"a 1 MiB tmpfs is mounted ({r.stdout.strip()})")
    if r.returncode != 0:
        return
    try:
        ck = os.path.join(mount, "ck")
        args = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
        # (the metrics outside it: only the checkpoints fill the disk)
        for o in layout(1, 1, 2) + ["training.steps=100", "checkpoint.interval=1",
                                    "checkpoint.keep=100", f"checkpoint.dir={ck}",
                                    f"logging.metrics={os.path.join(tmp, 'full_disk.jsonl')}"]:
            args += ["--set", o]
        t0 = time.monotonic()
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=h.mpirun_env(), timeout=300)
        seconds = time.monotonic() - t0
        lines = error_lines(p.stdout)
        saved = [d for d in entries_of(ck) if d.startswith("step_")]
        newest = os.path.join(ck, saved[-1]) if saved else None
        expected = ("cannot write: No space left on device (ENOSPC); "
                    f"{newest} is the newest checkpoint, as it was (checkpoint.on_error: stop)")
        h.check(p.returncode == 1 and len(lines) == 1 and expected in lines[0]
                and "MPI_ABORT" not in p.stdout,
                f"real full disk: one line from rank 0 and exit code 1 (got {p.returncode}): {lines}")
        h.check(entries_of(ck) == saved and
                h.run([trident, "checkpoint", "info", newest], expect_ok=False).returncode == 0,
                f"real full disk: only whole checkpoints are left, the newest verifies "
                f"({entries_of(ck)})")
        print(f"figure: real full disk (tmpfs of 1 MiB): the job ended {seconds:.1f} s after it "
              f"started, {len(saved)} checkpoints saved before the disk was full", flush=True)
    finally:
        subprocess.run(["umount", mount])


def train_run(trident, base, ranks, overrides, env=None):
    """`trident train` under mpirun to its end: its output (stderr with stdout) and code."""
    args = ["mpirun", "--oversubscribe", "-np", str(ranks), trident, "train"] + base
    for o in overrides:
        args += ["--set", o]
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**h.mpirun_env(), **(env or {})}, timeout=300)


def nan_gradient(trident, base, tmp):
    """A NaN planted in one rank's gradients (TRIDENT_TEST_NAN_GRADIENT) on 2x1x2: the update is
    skipped on every rank, and the rank and stage that saw it are named; NaNs from step 5 on
    stop the run at the third skip in a row with the newest checkpoint as it was."""
    def train(ck, nan, metrics):
        return train_run(trident, base, 4, layout(2, 1, 2) + [
            "training.steps=10", "training.nonfinite=skip", "training.max_skipped=3",
            "checkpoint.interval=2", f"checkpoint.dir={ck}", f"logging.metrics={metrics}"],
            {"TRIDENT_TEST_NAN_GRADIENT": nan})
    seen = ("the loss or gradients are not finite (non-finite gradients on rank 3 (pp 1, tp 0, "
            "dp 1), pipeline stage 1, the lowest rank to see any, before the data-parallel "
            "reduction)")
    metrics = os.path.join(tmp, "nan_once.jsonl")
    p = train(os.path.join(tmp, "ck_nan_once"), "4:3", metrics)
    warnings = [x for x in p.stdout.splitlines() if x.startswith("trident: warning:")]
    h.check(p.returncode == 0 and warnings == [
        f"trident: warning: step 4: {seen}; the update is skipped on every rank (1 in a row; "
        "training.max_skipped: 3)"], f"one NaN: one warning naming rank 3, stage 1, exit code "
        f"{p.returncode}: {warnings}")
    records = h.losses(metrics)
    h.check([(r["step"], r.get("skip_reason")) for r in records if r["skipped"]]
            == [(4, "nonfinite")] and records[-1]["skipped_total"] == 1,
            "one NaN: the metrics record step 4 alone as skipped, for a non-finite value")

    ck = os.path.join(tmp, "ck_nan")
    p = train(ck, "5-10:3", os.path.join(tmp, "nan_stop.jsonl"))
    lines = error_lines(p.stdout)
    expected = (f"trident: error: step 7: 3 updates skipped in a row (training.max_skipped: 3), "
                f"the last as {seen}; training stopped; {ck}/step_000006 is the newest "
                f"checkpoint, as it was")
    h.check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout,
            f"NaNs from step 5: one line, exit code 1 (got {p.returncode}): {lines}")
    kept = entries_of(ck)
    h.check(kept == ["step_000002", "step_000004", "step_000006"]
            and h.run([trident, "checkpoint", "info", ck], expect_ok=False).returncode == 0,
            f"NaNs from step 5: the checkpoints are kept and verify ({kept})")
    # Steps 5 and 6 were skipped: step 6's checkpoint holds step 4's weights and moments.
    for shard in ["pp0_tp0_dp0.safetensors", "pp1_tp0_dp1.safetensors"]:
        a = h.read_safetensors(os.path.join(ck, "step_000004", shard))
        b = h.read_safetensors(os.path.join(ck, "step_000006", shard))
        h.check(a.keys() == b.keys() and all(a[k] == b[k] for k in a),
                f"NaNs from step 5: {shard} of steps 4 and 6 bitwise alike ({len(a)} tensors)")


def corrupt_replica(trident, base, tmp):
    """A bit flipped in one rank's copy of a weight (TRIDENT_TEST_CORRUPT_REPLICA) before the
    replica check of step 4 (training.check_replicas: 2): the run stops there, naming the rank
    and the tensor, with the checkpoint of step 2 as it was; the check of step 2 passed."""
    cases = [
        # 3 replicas with ZeRO-0: rank 0 is the odd one out, whichever rank tells.
        ((1, 1, 3), ["parallel.zero_stage=0", "training.global_batch=6"], "0:h.0.attn.c_attn.weight",
         "the data-parallel replicas disagree: rank 0 (pp 0, tp 0, dp 0) holds another "
         "h.0.attn.c_attn.weight than rank 1 (pp 0, tp 0, dp 1) and 1 other(s) of its 3 do"),
        # A LayerNorm every tensor rank holds whole.
        ((1, 2, 1), [], "1:h.1.ln_2.bias",
         "the tensor-parallel ranks disagree: rank 1 (pp 0, tp 1, dp 0) holds another "
         "h.1.ln_2.bias than rank 0 (pp 0, tp 0, dp 0)"),
        # An expert split over E = 2 with hybrid sharding: compared across the ranks holding
        # it (ranks 0 and 2), not the ranks holding other experts.
        ((1, 1, 4), ["model.arch=llama", "model.moe.experts=4", "parallel.expert=2",
                     "parallel.data_shard=2", "training.global_batch=8"],
         "2:layers.0.mlp.experts.0.gate_proj.weight",
         "the expert-data replicas disagree: rank 2 (pp 0, tp 0, dp 2) holds another "
         "layers.0.mlp.experts.0.gate_proj.weight than rank 0 (pp 0, tp 0, dp 0)"),
    ]
    for (p_, m, d), extra, fault, said in cases:
        ck = os.path.join(tmp, f"ck_replica_{p_}{m}{d}")
        p = train_run(trident, base, p_ * m * d, layout(p_, m, d) + extra + [
            "training.steps=6", "training.check_replicas=2", "checkpoint.interval=2",
            f"checkpoint.dir={ck}"], {"TRIDENT_TEST_CORRUPT_REPLICA": f"4:{fault}"})
        lines = error_lines(p.stdout)
        expected = (f"trident: error: training.check_replicas: at step 4 {said}; training "
                    f"stopped; {ck}/step_000002 is the newest checkpoint, as it was")
        h.check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout
                and entries_of(ck) == ["metrics.jsonl", "step_000002"],
                f"corrupt replica on {p_}x{m}x{d}: one line, exit code 1 (got {p.returncode}), "
                f"step_000002 kept: {lines}")


def straggler(trident, base, tmp):
    """A rank slowed by 50 ms a step (TRIDENT_TEST_SLOW_RANK) on 1x1x4, with
    training.straggler_factor 4 and logging.interval 5: each interval's report names it, with
    its coordinates and host (the run's first step, with its one-time costs, left out), and
    names no other rank."""
    p = train_run(trident, base, 4, layout(1, 1, 4) + [
        "training.micro_batch=1", "training.steps=20", "training.straggler_factor=4",
        "logging.interval=5"], {"TRIDENT_TEST_SLOW_RANK": "2:50"})
    lines = [x for x in p.stdout.splitlines() if x.startswith("straggler:")]
    pattern = (r"straggler: steps (\d+)-(\d+): rank 2 \(pp 0, tp 0, dp 2\) on host "
               + re.escape(socket.gethostname()) + r" works \d+\.\d{3} s a step outside "
               r"communication, \d+\.\d times the median rank's \d+\.\d{3} s "
               r"\(training.straggler_factor: 4\); it waits .* a step")
    intervals = [re.fullmatch(pattern, x).groups() for x in lines if re.fullmatch(pattern, x)]
    h.check(p.returncode == 0 and intervals == [("2", "5"), ("6", "10"), ("11", "15"),
                                                ("16", "20")] and len(lines) == 4,
            f"straggler: rank 2 alone named in each interval, with its host: {lines}")


def async_checkpoint(trident, base, tmp, ref):
    """checkpoint.async on 1x1x2: the checkpoints are those a synchronous save writes (every
    shard's SHA-256 alike); rank 1 killed while its shard of step 6 is written in the background
    (TRIDENT_TEST_CRASH_IN_SAVE) leaves step_000004 complete and step 6 uncommitted, and the job
    resumes from step 4 with the uninterrupted losses."""
    def train(ck, extra, env=None, metrics=None):
        return train_run(trident, base, 2, layout(1, 1, 2) + [
            "training.steps=8", "checkpoint.interval=2", f"checkpoint.dir={ck}"] + extra
            + ([f"logging.metrics={metrics}"] if metrics else []), env)

    def files(ck, step):
        with open(os.path.join(ck, f"step_{step:06d}", "manifest.json")) as f:
            return [(x["name"], x["sha256"]) for x in json.load(f)["files"]
                    if x["name"] != "config.yaml"]  # the config differs: checkpoint.async

    ck_sync, ck_async = os.path.join(tmp, "ck_sync"), os.path.join(tmp, "ck_async")
    train(ck_sync, [])
    p = train(ck_async, ["checkpoint.async=true"])
    h.check(p.returncode == 0 and f"checkpoint: {ck_async}/step_000002 being written in the "
            "background" in p.stdout and entries_of(ck_async) == entries_of(ck_sync)
            == ["metrics.jsonl", "step_000004", "step_000006", "step_000008"],
            f"async: the run ends (exit code {p.returncode}) with the checkpoints a synchronous "
            f"one keeps ({entries_of(ck_async)})")
    h.check(all(files(ck_async, s) == files(ck_sync, s) for s in (4, 6, 8)),
            "async: every shard of steps 4, 6 and 8 has the synchronous save's SHA-256")

    ck = os.path.join(tmp, "ck_async_kill")
    p = train(ck, ["checkpoint.async=true"], {"TRIDENT_TEST_CRASH_IN_SAVE": "6:1"})
    left = entries_of(ck)
    h.check(p.returncode not in (0, None) and "rank 1 killed mid-save of step 6" in p.stdout
            and left == [".tmp_step_000006", "metrics.jsonl", "step_000002", "step_000004"]
            and h.run([trident, "checkpoint", "info", ck], expect_ok=False).returncode == 0,
            f"async, killed mid-save: the job ends (exit code {p.returncode}), step 4 complete "
            f"and verified, step 6 uncommitted ({left})")
    metrics = os.path.join(tmp, "async_resumed.jsonl")
    p = train(ck, ["checkpoint.async=true"], metrics=metrics)
    got = [x["loss"] for x in h.losses(metrics)]
    h.check(f"resumed: {ck}/step_000004 at step 4" in p.stdout and len(got) == 4
            and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, ref[4:])),
            f"async, killed mid-save: the job resumes from step 4 with the uninterrupted losses "
            f"({got} vs {ref[4:]})")


def reference_losses(trident, base, tmp):
    """The uninterrupted run's losses, for the resumed run after a failed save."""
    metrics = os.path.join(tmp, "ref.jsonl")
    h.run([trident, "train"] + base + ["--set", "training.steps=8", "--set",
                                        f"logging.metrics={metrics}"])
    return [x["loss"] for x in h.losses(metrics)]


FAULTS = {
    "stall_2x1x1": lambda t, base, tmp: stalled_rank(t, base, base[1], tmp, 2, 1, 1),
    "stall_1x2x1": lambda t, base, tmp: stalled_rank(t, base, base[1], tmp, 1, 2, 1),
    "stall_1x1x2": lambda t, base, tmp: stalled_rank(t, base, base[1], tmp, 1, 1, 2),
    "dead_sigkill": lambda t, base, tmp: dead_rank(t, base, base[1], tmp, "sigkill"),
    "dead_error": lambda t, base, tmp: dead_rank(t, base, base[1], tmp, "error"),
    "dead_oom": lambda t, base, tmp: dead_rank(t, base, base[1], tmp, "oom"),
    "full_disk": lambda t, base, tmp: full_disk(t, base, tmp, reference_losses(t, base, tmp)),
    "logging": lambda t, base, tmp: logging_failures(t, base, tmp),
    "changed_data": lambda t, base, tmp: changed_data(t, base, tmp),
    "dead_no_abort": lambda t, base, tmp: dead_rank_no_abort(t, base, base[1], tmp),
    "real_oom": lambda t, base, tmp: real_oom(t, base, base[1], tmp),
    "real_full_disk": lambda t, base, tmp: real_full_disk(t, base, base[1], tmp),
    "nan_gradient": lambda t, base, tmp: nan_gradient(t, base, tmp),
    "corrupt_replica": lambda t, base, tmp: corrupt_replica(t, base, tmp),
    "straggler": lambda t, base, tmp: straggler(t, base, tmp),
    "async_checkpoint": lambda t, base, tmp: async_checkpoint(t, base, tmp,
                                                              reference_losses(t, base, tmp)),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--fault", required=True, choices=sorted(FAULTS))
    a = p.parse_args()
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not found (Debian's openmpi-bin)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        base = h.tiny_run(tmp)
        FAULTS[a.fault](a.trident, base, tmp)
    if h.failures:
        print(f"{len(h.failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
