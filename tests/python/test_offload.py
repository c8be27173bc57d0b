#!/usr/bin/python3
"""The optimizer state offloaded to files (optimizer.offload: nvme) against none.

- Losses and checkpoint tensors (weights, fp32 master weights, Adam's moments) bitwise equal
  to no offload, element by element, at D = 1 and D = 2 with ZeRO-1 and ZeRO-2, the state
  streamed in chunks far smaller than it (many read-ahead and write-behind rounds).
- Bytes moved per step, as the metrics count them on rank 0: 12 bytes read and 12 written per
  parameter it owns (master weights, m and v): the parameter count from the model's shape
  (Vp·C + T·C + L·(12C² + 13C) + 2C, Vp the vocabulary padded to 128), over D.
- Checkpoints save from and resume into offloaded state and reshard: an nvme run's step-5
  checkpoint resumed into none (bitwise the uninterrupted run), a none run's into nvme
  (bitwise), and the nvme run's into nvme at D = 2 (bitwise none's run resumed alike).
- Faults: a missing directory, a file for a directory, a read-only one (a tmpfs mounted ro),
  a full one (a tmpfs of 64 KiB) at start-up, and one with room for one rank's state of
  two: one error naming optimizer.offload_dir and the path; a failed write (TRIDENT_TEST_WRITE_ERROR, on rank 1 of 2) in a step and as resumed
  state is written, a failed read (TRIDENT_TEST_READ_ERROR) in a checkpoint's save, and the
  state files removed mid-run: one error naming the directory, every rank gone, exit 1, the
  last checkpoint intact and nothing half-saved left. The disk filled mid-run: nothing fails,
  the files' blocks having been reserved at the start.

Needs only the standard library, mpirun, and root for mount (as CI runs); exit 77 without
mpirun.
"""
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses,  # noqa: E402
                         losses_match, mpirun_env, run, start_train, tiny_run)

V, T, C, L = 300, 16, 32, 2
VP = (V + 127) // 128 * 128  # the embedding's rows: the vocabulary padded to 128
PARAMS = VP * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def error_lines(out):
    return [line for line in out.splitlines() if line.startswith("trident: error:")]


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["checkpoint.interval=5", "checkpoint.keep=10"])

        def train(ranks, name, overrides, expect_ok=True):
            args = [trident, "train"] + base
            for o in overrides + [f"logging.metrics={path(name + '.jsonl')}",
                                  f"checkpoint.dir={path('ck_' + name)}"]:
                args += ["--set", o]
            p = run(args, ranks=None if ranks == 1 else ranks, expect_ok=expect_ok)
            return p if not expect_ok else losses(path(name + ".jsonl"))

        os.makedirs(path("nvme"))
        nvme = ["optimizer.offload=nvme", f"optimizer.offload_dir={path('nvme')}",
                "optimizer.offload_chunk=4000"]
        for d, stage in [(1, 1), (2, 1), (2, 2)]:
            grid = [f"parallel.data={d}", f"parallel.zero_stage={stage}"]
            ref = train(d, f"none{d}{stage}", grid)
            got = train(d, f"nvme{d}{stage}", grid + nvme)
            check(losses_match(got, ref), f"D={d} ZeRO-{stage}: nvme's losses are none's, bitwise")
            diff = checkpoints_differ(path(f"ck_nvme{d}{stage}/step_000010"),
                                      path(f"ck_none{d}{stage}/step_000010"))
            check(diff is None, f"D={d} ZeRO-{stage}: nvme's checkpoint is none's, bitwise "
                                f"({diff})")
            owned = PARAMS // d  # PARAMS is even: no padding at D = 2
            moved = {(r["offload_read_bytes"], r["offload_written_bytes"]) for r in got}
            check(moved == {(12 * owned, 12 * owned)},
                  f"D={d} ZeRO-{stage}: 12 bytes read and written per owned parameter per step "
                  f"({moved}, {12 * owned} expected)")
        check(not os.listdir(path("nvme")), "the state files are gone after the runs")

        # Resumes from step 5 of an nvme run and of a none run, into the other, and into D = 2
        # (against none's step 5 resumed at D = 2: the sums over 2 replicas round otherwise).
        resume = lambda src: [f"checkpoint.resume={path('ck_' + src)}/step_000005"]  # noqa: E731
        train(2, "none_to_d2", ["parallel.data=2"] + resume("none11"))
        for name, src, ranks, extra, ref in [
                ("nvme_to_none", "nvme11", 1, [], "none11"),
                ("none_to_nvme", "none11", 1, nvme, "none11"),
                ("nvme_to_d2", "nvme11", 2, nvme + ["parallel.data=2"], "none_to_d2")]:
            got = train(ranks, name, extra + resume(src))
            check_resumed(path, name, ref, got)
        start_up_faults(trident, base, path)
        mid_run_faults(trident, base, path)
        filled_mid_run(trident, base, path, losses(path("none21.jsonl")))
    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")


def check_resumed(path, name, ref, got):
    """Run `name`, resumed at step 5 (its losses `got`), against `ref`'s uninterrupted run: the
    last 5 losses and the step-10 checkpoint, bitwise."""
    want = losses(path(ref + ".jsonl"))
    diff = checkpoints_differ(path(f"ck_{name}/step_000010"), path(f"ck_{ref}/step_000010"))
    check(losses_match(got, want[-5:]) and diff is None,
          f"{name}: resumed at step 5, {ref}'s losses and checkpoint, bitwise ({diff})")


def refused(trident, base, overrides, expected, what):
    args = [trident, "train"] + base
    for o in overrides:
        args += ["--set", o]
    p = run(args, expect_ok=False)
    lines = error_lines(p.stdout)
    check(p.returncode != 0 and len(lines) == 1 and expected in lines[0],
          f"{what}: refused at start-up naming it (exit {p.returncode}): {lines}")


def start_up_faults(trident, base, path):
    refused(trident, base, ["optimizer.offload=nvme"], "optimizer.offload: nvme needs "
            "optimizer.offload_dir", "nvme without optimizer.offload_dir")
    refused(trident, base, ["optimizer.offload_params=true"], "optimizer.offload_params: ",
            "offload_params")
    missing = path("no_such_dir")
    refused(trident, base, ["optimizer.offload=nvme", f"optimizer.offload_dir={missing}"],
            f"optimizer.offload_dir '{missing}' does not exist", "a missing offload_dir")
    refused(trident, base, ["optimizer.offload=nvme", f"optimizer.offload_dir={path('train.bin')}"],
            f"optimizer.offload_dir '{path('train.bin')}' is not a directory", "a file")
    for name, options, expected in [("ro", "ro,size=1m", "is not writable"),
                                    ("small", "size=64k", "has 65536 bytes free; this rank's optimizer "
                                     f"state needs {12 * PARAMS}")]:
        with tmpfs(path(name), options) as mount:
            if mount:
                refused(trident, base,
                        ["optimizer.offload=nvme", f"optimizer.offload_dir={mount}"],
                        f"optimizer.offload_dir '{mount}' {expected}",
                        f"a tmpfs mounted {options}")
    one_rank_short(trident, base, path)


@contextlib.contextmanager
def tmpfs(mount, options):
    """A tmpfs mounted at `mount` (made) with `options` while the block runs: its path, or None
    where it could not be mounted (a failed check)."""
    os.makedirs(mount)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", mount],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0, f"a tmpfs ({options}) is mounted ({r.stdout.strip()})")
    try:
        yield mount if r.returncode == 0 else None
    finally:
        if r.returncode == 0:
            subprocess.run(["umount", mount])


def one_rank_short(trident, base, path):
    """A tmpfs with room for one of two ranks' state files: the rank that finds no room stops
    both, with one line naming the directory, before step 1."""
    # 64 pages of 4 KiB: one rank's 12 x PARAMS / 2 bytes take 57 of them.
    with tmpfs(path("one_fits"), "size=256k") as mount:
        if not mount:
            return
        p = train_with_fault(trident, base, ["optimizer.offload=nvme", "parallel.data=2",
                                             f"optimizer.offload_dir={mount}",
                                             f"logging.metrics={path('one_fits.jsonl')}"], {})
        lines = error_lines(p.stdout)
        check(p.returncode == 1 and len(lines) == 1 and f"optimizer.offload_dir '{mount}'" in
              lines[0] and "MPI_ABORT" not in p.stdout and not os.path.exists(
                  path("one_fits.jsonl")) and not os.listdir(mount),
              f"room for one rank's state of two: one line, exit 1, no step, no file left "
              f"(got {p.returncode}): {lines}")


def train_with_fault(trident, base, overrides, fault):
    """`trident train` on 2 ranks with the test-only fault `fault` (environment variables)."""
    args = ["mpirun", "--oversubscribe", "-np", "2", trident, "train"] + base
    for o in overrides:
        args += ["--set", o]
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**mpirun_env(), **fault}, timeout=300)


def filled_mid_run(trident, base, path, ref):
    """The state files' disk filled up as soon as both files are there, before step 1 writes
    them (a tmpfs of 1 MiB; the steps slowed to 300 ms on rank 0 so that the run is still
    going): the files' blocks were reserved as they were made, so the run goes on to its end
    with none's losses, bitwise."""
    with tmpfs(path("fills"), "size=1m") as mount:
        if not mount:
            return
        metrics = path("fills.jsonl")
        job = start_train(trident, base, 2, [
            "optimizer.offload=nvme", f"optimizer.offload_dir={mount}", "parallel.data=2",
            "parallel.zero_stage=1", f"logging.metrics={metrics}"],
            {"TRIDENT_TEST_SLOW_RANK": "0:300"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(glob.glob(f"{mount}/optimizer_state.*")) < 2:
            time.sleep(0.01)
        filled = 0
        fd = os.open(os.path.join(mount, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                filled += os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        running = job.poll() is None
        try:
            job.communicate(timeout=300)
        finally:
            job.kill()
        got = losses(metrics)
        check(running and job.returncode == 0 and losses_match(got, ref),
              f"the disk filled ({filled} bytes) as the state files were made, the run going on "
              f"({running}): it ends (exit {job.returncode}) with none's losses, bitwise "
              f"({len(got)} steps)")


def mid_run_faults(trident, base, path):
    # A write that fails on rank 1 (as an I/O error would): both ranks stop at step 1.
    off = path("nvme_faults")
    os.makedirs(off)
    nvme = ["optimizer.offload=nvme", f"optimizer.offload_dir={off}", "parallel.data=2"]
    p = train_with_fault(trident, base, nvme + [f"checkpoint.dir={path('ck_write')}"],
                         {"TRIDENT_TEST_WRITE_ERROR": "optimizer_state.rank1:EIO"})
    lines = error_lines(p.stdout)
    expected = (f"trident: error: optimizer.offload_dir '{off}': cannot write "
                f"{off}/optimizer_state.rank1: Input/output error (EIO); no checkpoint has been "
                f"written to {path('ck_write')}")
    check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout,
          f"a failed write on rank 1: one line, exit 1 (got {p.returncode}): {lines}")

    # A read that fails on rank 1 in the save of step 2 (its reads: a pass over its state's
    # chunks a step, so the save's are the first after 2 passes): every rank stops, nothing
    # half-saved is left.
    chunks = -(-(PARAMS // 2) // 4000)
    ck = path("ck_read")
    p = train_with_fault(trident, base, nvme + ["optimizer.offload_chunk=4000",
                                                "checkpoint.interval=2", f"checkpoint.dir={ck}",
                                                f"logging.metrics={path('read.jsonl')}"],
                         {"TRIDENT_TEST_READ_ERROR": f"optimizer_state.rank1:EIO:{2 * chunks}"})
    lines = error_lines(p.stdout)
    expected = (f"trident: error: optimizer.offload_dir '{off}': cannot read "
                f"{off}/optimizer_state.rank1: Input/output error (EIO); no checkpoint has been "
                f"written to {ck}")
    steps = [r["step"] for r in losses(path("read.jsonl"))]
    left = [d for d in os.listdir(ck) if not d.startswith(".lock")]
    check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout
          and steps == [1, 2] and not left,
          f"a failed read on rank 1 in the save of step 2: one line, exit 1, steps {steps}, "
          f"nothing left in checkpoint.dir {left} (got {p.returncode}): {lines}")

    # A write that fails on rank 1 as the resumed state is written to its file.
    resumed = path("ck_nvme21/step_000005")
    p = train_with_fault(trident, base, nvme + [f"checkpoint.resume={resumed}",
                                                f"checkpoint.dir={path('ck_resume_write')}"],
                         {"TRIDENT_TEST_WRITE_ERROR": "optimizer_state.rank1:EIO"})
    lines = error_lines(p.stdout)
    expected = (f"trident: error: checkpoint.resume: {resumed}: optimizer.offload_dir '{off}': "
                f"cannot write {off}/optimizer_state.rank1: Input/output error (EIO)")
    check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout,
          f"a failed write on rank 1 as the state is resumed: one line, exit 1 "
          f"(got {p.returncode}): {lines}")

    # The state files removed under a long run: stopped, the last checkpoint intact.
    ck = path("ck_removed")
    metrics = path("removed.jsonl")
    job = start_train(trident, base, 2, nvme + [f"checkpoint.dir={ck}", "training.steps=100000",
                                                "checkpoint.interval=2",
                                                f"logging.metrics={metrics}"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not glob.glob(f"{ck}/step_0*"):
        time.sleep(0.2)
    for f in glob.glob(f"{off}/optimizer_state.rank*"):
        os.unlink(f)
    try:
        out, _ = job.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    lines = error_lines(out)
    check(job.returncode == 1 and len(lines) == 1 and f"optimizer.offload_dir '{off}'" in lines[0]
          and "was removed under the run" in lines[0] and "is the newest checkpoint" in lines[0],
          f"state files removed: one line naming the directory, exit 1 (got {job.returncode}): "
          f"{lines}")
    newest = sorted(d for d in os.listdir(ck) if d.startswith("step_"))[-1]
    check(run([trident, "checkpoint", "info", os.path.join(ck, newest)],
              expect_ok=False).returncode == 0, f"state files removed: {newest} verifies")


if __name__ == "__main__":
    main()
