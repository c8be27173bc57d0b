#!/usr/bin/python3
"""ZeRO-3's parameter shards in files (optimizer.offload_params: true) against in memory.

- Losses and checkpoint tensors (weights, fp32 master weights, Adam's moments) bitwise equal
  to the same ZeRO-3 run with the shard in memory, element by element, the optimizer state in
  files in both: D = 2 (resharding after use, and keeping the units), D = 2 × P = 2 (the tied
  embedding's unit on two stages; 1F1B and the zero-bubble ZB-H1, whose W gathers nothing),
  D = 4 sharded in runs of 2 (parallel.data_shard), and D = 2 × C = 2 (context parallelism).
- Rank 0's parameters held in memory between steps (the metrics' mem_params_bytes, the
  allocator's count): none with the shard in a file, the shard (S below) without.
- Bytes of the parameter file moved per step, as the metrics count them on rank 0, against
  the formula (docs/FORMULAS.md): with S the shard's bytes (4 · PARAMS / D at fp32; PARAMS,
  test_offload.py's, from the model's shape, Vp·C + T·C + L·(12C² + 13C) + 2C, Vp the vocabulary padded to 128),
  each gather reads its unit's part once, so a step reads S times the gathers of every unit:
  2m (a forward and a backward of each of the m microbatches) with resharding after use, 1
  without (parallel.reshard_after_forward: false); the update writes S. Step 1 besides writes
  S (the initialised shard moved to the file) and reads S (the first update takes the master
  weights from the parameters).
- Resume: an offload_params run's step-5 checkpoint into a ZeRO-3 run without it, and the
  reverse: bitwise the uninterrupted runs' last 5 losses and step-10 checkpoints.
- Start-up refusals naming both keys: offload_params below ZeRO-3, and without
  optimizer.offload: nvme; and a directory (a tmpfs of 128 KiB, mounted as root) without room
  for a rank's shard and state together: one line, before step 1, no file left.
- A failed read of rank 1's parameter file in step 2's forward (TRIDENT_TEST_READ_ERROR):
  one line naming the directory and the file, exit 1, no MPI_ABORT, no step 2 logged.

Needs only the standard library and mpirun; exit 77 without mpirun.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses,  # noqa: E402
                         losses_match, mpirun_env, run, tiny_run)
from test_offload import PARAMS, check_resumed, error_lines, tmpfs  # noqa: E402  (the same tiny model)


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["checkpoint.interval=5", "checkpoint.keep=10"])
        os.makedirs(path("nvme"))
        nvme = ["optimizer.offload=nvme", f"optimizer.offload_dir={path('nvme')}",
                "optimizer.offload_chunk=4000", "parallel.zero_stage=3"]
        offload = ["optimizer.offload_params=true"]

        def train(ranks, name, overrides):
            args = [trident, "train"] + base
            for o in nvme + overrides + [f"logging.metrics={path(name + '.jsonl')}",
                                         f"checkpoint.dir={path('ck_' + name)}"]:
                args += ["--set", o]
            run(args, ranks=ranks)
            return losses(path(name + ".jsonl"))

        shard = 4 * PARAMS // 2  # bytes; PARAMS is even: no padding at D = 2
        for name, grid, ranks, gathers in [
                ("d2", ["parallel.data=2"], 2, 2),  # m = 1
                ("d2_keep", ["parallel.data=2", "parallel.reshard_after_forward=false"], 2, 1),
                ("d2p2", ["parallel.data=2", "parallel.pipeline=2", "training.global_batch=8"],
                 4, None),
                ("d2p2_zb", ["parallel.data=2", "parallel.pipeline=2", "training.global_batch=8",
                             "parallel.schedule=zb-h1"], 4, None),
                ("d4_hybrid", ["parallel.data=4", "parallel.data_shard=2",
                               "training.global_batch=8"], 4, None),
                ("d2c2", ["parallel.data=2", "parallel.context=2"], 4, None)]:
            ref = train(ranks, "mem_" + name, grid)
            got = train(ranks, "file_" + name, grid + offload)
            diff = checkpoints_differ(path(f"ck_file_{name}/step_000010"),
                                      path(f"ck_mem_{name}/step_000010"))
            check(losses_match(got, ref) and diff is None,
                  f"{name}: offload_params' losses and checkpoint are in-memory's, bitwise "
                  f"({diff})")
            held = ({r["mem_params_bytes"] for r in ref}, {r["mem_params_bytes"] for r in got})
            check(held[1] == {0} and (ranks != 2 or held[0] == {shard}),
                  f"{name}: the allocator holds no shard of the parameters with them in "
                  f"files ({held})")
            if gathers is None:
                continue
            moved = [(r["offload_param_read_bytes"], r["offload_param_written_bytes"])
                     for r in got]
            want = [((gathers + 1) * shard, 2 * shard)] + [(gathers * shard, shard)] * 9
            check(moved == want, f"{name}: parameter file bytes per step are the formula's "
                                 f"({moved[:2]}, {want[:2]} expected)")
        check(not os.listdir(path("nvme")), "the parameter and state files are gone after the runs")

        # Resumes at step 5 of each kind into the other, against the uninterrupted runs.
        resume = lambda src: [f"checkpoint.resume={path('ck_' + src)}/step_000005"]  # noqa: E731
        for name, src, extra, ref in [("file_to_mem", "file_d2", [], "mem_d2"),
                                      ("mem_to_file", "mem_d2", offload, "file_d2")]:
            got = train(2, name, ["parallel.data=2"] + extra + resume(src))
            check_resumed(path, name, ref, got)
        refusals(trident, base, path)
        failed_read(trident, base, path, nvme + offload)
    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")


def refusals(trident, base, path):
    for overrides, expected in [
            (["parallel.zero_stage=2", "optimizer.offload=nvme",
              f"optimizer.offload_dir={path('nvme')}"],
             "optimizer.offload_params: true needs parallel.zero_stage: 3 (it is 2)"),
            (["parallel.zero_stage=3"], "optimizer.offload_params: true needs optimizer.offload: "
             "nvme")]:
        args = [trident, "train"] + base
        for o in overrides + ["optimizer.offload_params=true"]:
            args += ["--set", o]
        p = run(args, expect_ok=False)
        lines = error_lines(p.stdout)
        check(p.returncode != 0 and len(lines) == 1 and expected in lines[0],
              f"refused at start-up naming both keys (exit {p.returncode}): {lines}")
    # A directory with room for neither rank's shard and state (16 bytes a parameter owned).
    with tmpfs(path("small"), "size=128k") as mount:
        if not mount:
            return
        args = [shutil.which("mpirun"), "--oversubscribe", "-np", "2", trident, "train"] + base
        for o in ["parallel.data=2", "parallel.zero_stage=3", "optimizer.offload=nvme",
                  f"optimizer.offload_dir={mount}", "optimizer.offload_params=true"]:
            args += ["--set", o]
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=mpirun_env(), timeout=120)
        lines = error_lines(p.stdout)
        check(p.returncode == 1 and len(lines) == 1 and lines[0].endswith(
              f"this rank's parameter shard and optimizer state need {16 * PARAMS // 2}")
              and "MPI_ABORT" not in p.stdout and not os.listdir(mount),
              f"no room for the shard and the state: one line before step 1, no file left "
              f"(exit {p.returncode}): {lines}")


def failed_read(trident, base, path, overrides):
    # Rank 1's reads of step 1: its 4 units gathered twice each (m = 1), and the shard by the
    # first update, a read per chunk of 4000; the next read fails, in step 2's first gather.
    skip = 8 + -(-(PARAMS // 2) // 4000)
    off = path("nvme")
    ck = path("ck_read")
    args = [shutil.which("mpirun"), "--oversubscribe", "-np", "2", trident, "train"] + base
    for o in overrides + ["parallel.data=2", f"checkpoint.dir={ck}",
                          f"logging.metrics={path('read.jsonl')}"]:
        args += ["--set", o]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env={**mpirun_env(), "TRIDENT_TEST_READ_ERROR": f"param_shard.rank1:EIO:{skip}"},
                       timeout=120)
    lines = error_lines(p.stdout)
    expected = (f"trident: error: optimizer.offload_dir '{off}': cannot read "
                f"{off}/param_shard.rank1: Input/output error (EIO); no checkpoint has been "
                f"written to {ck}")
    steps = [r["step"] for r in losses(path("read.jsonl"))]
    check(p.returncode == 1 and lines == [expected] and "MPI_ABORT" not in p.stdout
          and steps == [1],
          f"a failed read on rank 1 in step 2: one line, exit 1, steps {steps} "
          f"(got {p.returncode}): {lines}")


if __name__ == "__main__":
    main()
