"""Checkpoints across layouts, under mpirun: resume is bitwise on 2x2x2; a checkpoint written
by one layout resumes in another (2x2x2 -> 1x1x1 -> the interleaved schedule, which needs
P >= 2, on 2x1x2 with v = 2, and 1F1B on 1x2x2; a ZeRO-0 checkpoint of 2x1x2 -> 1x1x1) with
the uninterrupted one-process run's losses to 1e-5; export from 2x2x2 gives one process the
model, to its loss; SIGTERM to one rank (as Slurm sends it) or SIGUSR1 to mpirun (which passes
it on) stops every rank after the same step with a checkpoint and exit code 0; a rank killed
in the middle of writing its shard (the test fault TRIDENT_TEST_CRASH_IN_SAVE) leaves the save
in its temporary directory and the previous checkpoint usable, and the job resumes from it. A
2x2x2 resume reads by share: at most an eighth of the checkpoint's bytes per rank, plus
headers.

All in fp32 on a model of 4 layers (interleaving needs P*v to divide them) with micro batch 1
(interleaving needs the microbatches of a step to be a multiple of P).
"""
import os
import re
import signal
import sys
import tempfile
import time

import mpi_harness as h

TOL = 1e-5


def loss_list(path):
    return [r["loss"] for r in h.losses(path)]


def close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= TOL * abs(y) for x, y in zip(a, b))


def layout(p, m, d, *extra):
    return [f"parallel.pipeline={p}", f"parallel.tensor={m}", f"parallel.data={d}", *extra]


def wait_for_steps(metrics, n, job):
    while job.poll() is None:
        if os.path.exists(metrics) and len(open(metrics).readlines()) >= n:
            return True
        time.sleep(0.05)
    return False


def rchar(pid):
    """Bytes the process has read through read(2) and its kind (the kernel's count,
    /proc/PID/io), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except OSError:
        return None


def reads_by_first_step(trident, base, config, metrics, overrides):
    """Each rank's rchar once the job's first step is done (its start-up, and a resume's
    reads, behind it), by world rank; the job is killed then."""
    job = h.start_train(trident, base, 8, overrides + ["training.steps=100000",
                                                       f"logging.metrics={metrics}"])
    wait_for_steps(metrics, 1, job)
    pids = h.trident_pids(config)
    reads = {rank: rchar(pid) for rank, pid in pids.items()}
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    job.communicate(timeout=120)
    return reads


def main():
    trident, _ = h.binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)
        # Uniform cuts: each stage then holds about half the model (the tied embedding on
        # both), so each rank's share of the state is about an eighth of it on 2x2x2.
        base = h.tiny_run(tmp, ["model.layers=4", "training.micro_batch=1", "training.steps=8",
                                "parallel.stage_layers=uniform"])
        config = base[1]

        def train(ranks, overrides):
            args = [trident, "train"] + base
            for o in overrides:
                args += ["--set", o]
            return h.run(args, ranks=None if ranks == 1 else ranks)

        # The uninterrupted references: one process, and 2x2x2 with a checkpoint every 4 steps.
        train(1, [f"checkpoint.dir={path('ref')}", "checkpoint.interval=4",
                  f"logging.metrics={path('ref.jsonl')}"])
        ref = loss_list(path("ref.jsonl"))
        valid = f"data.valid={path('train.bin')}"
        train(8, layout(2, 2, 2) + [f"checkpoint.dir={path('ck8')}", "checkpoint.interval=4",
                                    valid, f"logging.metrics={path('full8.jsonl')}"])
        full8 = loss_list(path("full8.jsonl"))
        h.check(close(full8, ref), "2x2x2 trains as one process does")

        # Resume on 2x2x2 from its step 4: bitwise.
        p = train(8, layout(2, 2, 2) + [f"checkpoint.resume={path('ck8/step_000004')}",
                                        f"checkpoint.dir={path('ck8b')}",
                                        f"logging.metrics={path('b8.jsonl')}"])
        h.check("resumed: " + path("ck8/step_000004") + " at step 4" in p.stdout,
                "2x2x2 says where it resumed")
        h.check(loss_list(path("b8.jsonl")) == full8[4:], "2x2x2 resumed: the same losses")
        differ = h.checkpoints_differ(path("ck8b/step_000008"), path("ck8/step_000008"))
        h.check(differ is None, "2x2x2 resumed: the checkpoint of step 8 equals the uninterrupted "
                                f"run's bitwise: weights, master weights, Adam moments ({differ or 'all'})")
        # Each rank read its eighth: at most 1/8 of the checkpoint's bytes of tensors, plus
        # the headers of the shards it drew from (fewer bytes than one shard).
        read = re.search(r"checkpoint read: at most (\d+) bytes of tensors and (\d+) of headers "
                         r"on a rank, of the checkpoint's (\d+)", p.stdout)
        tensors, headers, whole = (int(x) for x in read.groups()) if read else (-1, -1, 0)
        shards = [f for f in os.listdir(path("ck8/step_000004")) if f.endswith(".safetensors")]
        biggest = max(os.path.getsize(os.path.join(path("ck8/step_000004"), f)) for f in shards)
        h.check(read and 0 < tensors <= whole / 8 and 0 < headers < biggest,
                f"2x2x2 resume reads by share: {tensors} bytes of tensors per rank at most, "
                f"{whole / 8:.0f} allowed (1/8 of {whole}), headers {headers}")
        # The same by the kernel's count of each rank's reads (/proc/PID/io rchar): a resumed
        # job against a fresh one, each stopped after its first step. The difference is the
        # checkpoint's reads: at most an eighth of it plus the manifest, the config and the
        # headers of the shards drawn from (each under 64 KiB here).
        fresh = reads_by_first_step(trident, base, config, path("fresh.jsonl"), layout(2, 2, 2))
        resumed = reads_by_first_step(trident, base, config, path("resumed_io.jsonl"),
                                      layout(2, 2, 2) + [f"checkpoint.resume={path('ck8/step_000004')}"])
        extra = {r: resumed[r] - fresh[r] for r in fresh if fresh.get(r) and resumed.get(r)}
        h.check(len(extra) == 8 and all(0 < e <= whole / 8 + (64 << 10) for e in extra.values()),
                f"2x2x2 resume reads by share, by /proc/PID/io: each rank read {sorted(extra.values())} "
                f"bytes more than a fresh start, at most {whole / 8 + (64 << 10):.0f} allowed "
                f"(1/8 of {whole} + 64 KiB)")

        # 2x2x2 -> 1x1x1 (steps 5, 6; a checkpoint at 6) -> 2x1x2 interleaved and 1x2x2 1F1B.
        train(1, [f"checkpoint.resume={path('ck8/step_000004')}", f"checkpoint.dir={path('ck1')}",
                  "checkpoint.interval=2", "training.steps=8",
                  f"logging.metrics={path('r1.jsonl')}"])
        r1 = loss_list(path("r1.jsonl"))
        h.check(close(r1, ref[4:]), f"2x2x2 -> 1x1x1: the uninterrupted losses ({r1} vs {ref[4:]})")
        for name, ranks, lay in [
                ("2x1x2 interleaved v=2", 4,
                 layout(2, 1, 2, "parallel.schedule=interleaved", "parallel.virtual_stages=2")),
                ("1x2x2 1F1B", 4, layout(1, 2, 2)),
        ]:
            metrics = path(name.replace(" ", "_") + ".jsonl")
            train(ranks, lay + [f"checkpoint.resume={path('ck1/step_000006')}",
                                f"checkpoint.dir={path('ck_' + name.replace(' ', '_'))}",
                                f"logging.metrics={metrics}"])
            got = loss_list(metrics)
            h.check(close(got, ref[6:]), f"1x1x1 -> {name}: the uninterrupted losses ({got} vs {ref[6:]})")

        # A ZeRO-0 checkpoint (every replica holds the whole optimizer state; replica 0 writes it).
        train(4, layout(2, 1, 2, "parallel.zero_stage=0") +
              [f"checkpoint.resume={path('ck8/step_000004')}", f"checkpoint.dir={path('ckz')}",
               "checkpoint.interval=1"])
        train(1, [f"checkpoint.resume={path('ckz/step_000007')}", f"checkpoint.dir={path('ckz1')}",
                  f"logging.metrics={path('z1.jsonl')}"])
        h.check(close(loss_list(path("z1.jsonl")), ref[7:]), "ZeRO-0 2x1x2 -> 1x1x1: the uninterrupted loss")

        info = h.run([trident, "checkpoint", "info", path("ck8")])
        h.check("layout: 2 x 2 x 1 x 2" in info.stdout and "all 9 files match" in info.stdout,
                "checkpoint info prints the layout and checks 8 shards and the config")

        # Export from 2x2x2, loaded by one process: the same model (its validation loss after a
        # step with learning rate 1e-30, which changes no weight).
        h.run([trident, "export", "--checkpoint", path("ck8"), "--output", path("w8.safetensors")])
        train(1, [f"model.init_from={path('w8.safetensors')}", "training.steps=1", "training.lr=1e-30",
                  "training.min_lr=0", valid, f"logging.metrics={path('w8.jsonl')}"])
        got, want = h.losses(path("w8.jsonl"))[0]["val_loss"], h.losses(path("full8.jsonl"))[-1]["val_loss"]
        h.check(abs(got - want) <= TOL * want,
                f"export from 2x2x2 -> model.init_from: the model's loss ({got} vs {want})")

        # SIGTERM to one rank of two, or SIGUSR1 to mpirun: both ranks stop after the same
        # step, checkpointed, exit code 0.
        for sig, to_mpirun in [(signal.SIGTERM, False), (signal.SIGUSR1, True)]:
            name = signal.Signals(sig).name
            metrics, ck = path(name + ".jsonl"), path("ck_" + name)
            job = h.start_train(trident, base, 2, layout(2, 1, 1) + [
                "training.steps=100000", f"checkpoint.dir={ck}", f"logging.metrics={metrics}"])
            if wait_for_steps(metrics, 3, job):
                os.kill(job.pid if to_mpirun else max(h.trident_pids(config).items())[1], sig)
            out, _ = job.communicate(timeout=300)
            done = len(h.losses(metrics))
            h.check(job.returncode == 0, f"{name}: exit code 0 (got {job.returncode})")
            h.check(f"preempted by {name} ({int(sig)}) after step {done}" in out and
                    f"checkpoint written to {ck}/step_{done:06d}" in out,
                    f"{name}: the message names the step and the checkpoint")
            h.check(h.run([trident, "checkpoint", "info", ck], expect_ok=False).returncode == 0,
                    f"{name}: the checkpoint is complete")
            if job.returncode != 0:
                print(out)

        # Rank 1 of 2 dies by SIGKILL in the save of step 6, its shard half written: the save
        # stays in .tmp_step_000006, the checkpoints before it verify, and resume: auto goes on
        # from step 5 with the uninterrupted run's losses, its own save clearing the wreck.
        ckk = path("ckk")
        job = h.start_train(trident, base, 2, layout(1, 1, 2) + [
            f"checkpoint.dir={ckk}", "checkpoint.interval=1"],
            env={"TRIDENT_TEST_CRASH_IN_SAVE": "6:1"})
        out, _ = job.communicate(timeout=300)
        entries = sorted(e for e in os.listdir(ckk) if e != ".lock")  # the run's lock file
        # (and the metrics, logging.metrics' default, beside the checkpoints)
        h.check(job.returncode != 0 and entries == [".tmp_step_000006", "metrics.jsonl",
                                                    "step_000003", "step_000004", "step_000005"],
                f"killed mid-save: the job failed ({job.returncode}) and left {entries}")
        if job.returncode == 0:
            print(out)
        torn = os.path.join(ckk, ".tmp_step_000006", "pp0_tp0_dp1.safetensors")
        whole = os.path.join(ckk, "step_000005", "pp0_tp0_dp1.safetensors")
        h.check(os.path.exists(torn) and os.path.getsize(torn) == os.path.getsize(whole) // 2 and
                not os.path.exists(os.path.join(ckk, ".tmp_step_000006", "manifest.json")),
                "killed mid-save: rank 1's shard half written, no manifest")
        infos = [h.run([trident, "checkpoint", "info", os.path.join(ckk, d)], expect_ok=False)
                 for d in entries if d.startswith("step_")]
        h.check(all(p.returncode == 0 for p in infos),
                "killed mid-save: every step_ directory verifies")
        p = train(2, layout(1, 1, 2) + [f"checkpoint.dir={ckk}",
                                        f"logging.metrics={path('resumed.jsonl')}"])
        h.check(f"resumed: {ckk}/step_000005 at step 5" in p.stdout,
                "killed mid-save: resume: auto takes step 5, the newest complete checkpoint")
        got = loss_list(path("resumed.jsonl"))
        h.check(close(got, ref[5:]), f"killed mid-save: the uninterrupted losses ({got} vs {ref[5:]})")
        h.check(not any(d.startswith(".tmp_") for d in os.listdir(ckk)),
                "killed mid-save: the next save clears the interrupted one")

    if h.failures:
        print(f"{len(h.failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
