#!/usr/bin/python3
"""A matrix optimizer's state off the device (optimizer.offload: host and nvme with
optimizer.name: muon and galore) against none, on the CPU backend.

- Losses and checkpoint tensors (weights, fp32 master weights, Muon's momentum, AdamW's
  moments of the other parameters, GaLore's per-matrix moments and projectors) bitwise equal to
  no offload, element by element: D = 1, and D = 2 with ZeRO-1, the state in chunks of 4,000
  parameters (many per rank); and D = 2 with ZeRO-3 under nvme with the parameter shard in its
  file too (optimizer.offload_params). GaLore at rank 8 with a new projector every 3 steps, so that the
  projector changes within the run and after a resume.
- nvme's bytes moved per step on rank 0 (the metrics): every array kept for every owned
  parameter (Muon 16 bytes: master, momentum, m, v; GaLore 12: master, m, v), the file streamed
  twice (the matrices' inputs first): Muon 32 read and 32 written per owned parameter, GaLore
  24 read and 12 written (its first pass writes nothing back). The parameter count from the
  model's shape (Vp·C + T·C + L·(12C² + 13C) + 2C, Vp the vocabulary padded to 128), over D.
- The start-up line: rank 0's state off the device, the bytes per owned parameter above.
- Checkpoints: a none run's step-5 checkpoint resumed into host and nvme, and the host and nvme
  runs' step-5 checkpoints into none, each bitwise none's uninterrupted run (the last 5 losses
  and the step-10 checkpoint).
- The planner (`trident plan --json`): Muon at D = 2 under host: no state on the device, 16
  bytes per owned parameter in host memory; GaLore at D = 1 under host: on the device exactly
  its per-matrix state (rank r = 8 for each layer matrix (m, n): 2·r·max(m, n) for the moments
  and r·n (m ≥ n) or m·r for the projector, fp32), 12 bytes per parameter in host memory.

Needs only the standard library and mpirun; exit 77 without mpirun.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses,  # noqa: E402
                         losses_match, run, tiny_run)

V, T, C, L = 300, 16, 32, 2
VP = (V + 127) // 128 * 128  # the embedding's rows: the vocabulary padded to 128
PARAMS = VP * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
GALORE_RANK = 8
# Per optimizer: its overrides, the kinds its checkpoints hold, its bytes per parameter off the
# device, and the bytes nvme reads and writes per owned parameter and step.
OPTIMIZERS = {
    "muon": (["optimizer.name=muon"], ("param", "master", "momentum", "exp_avg", "exp_avg_sq"),
             16, (32, 32)),
    "galore": (["optimizer.name=galore", f"optimizer.galore.rank={GALORE_RANK}",
                "optimizer.galore.update_gap=3"],
               ("param", "master", "exp_avg", "exp_avg_sq", "MATRIX/exp_avg", "MATRIX/exp_avg_sq",
                "MATRIX/projector"), 12, (24, 12)),
}


def galore_matrix_bytes():
    """GaLore's per-matrix state of every layer matrix (output, input features): GPT-2's c_attn
    (3C, C), attention c_proj (C, C), c_fc (4C, C), MLP c_proj (C, 4C)."""
    floats = 0
    for m, n in [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]:
        r = min(GALORE_RANK, m, n)
        floats += 2 * r * max(m, n) + (r * n if m >= n else m * r)
    return 4 * L * floats


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["checkpoint.interval=5", "checkpoint.keep=10"])
        os.makedirs(path("nvme"))
        where = {"none": [], "host": ["optimizer.offload=host", "optimizer.offload_chunk=4000"],
                 "nvme": ["optimizer.offload=nvme", f"optimizer.offload_dir={path('nvme')}",
                          "optimizer.offload_chunk=4000"]}

        def train(ranks, name, overrides):
            args = [trident, "train"] + base
            for o in overrides + [f"logging.metrics={path(name + '.jsonl')}",
                                  f"checkpoint.dir={path('ck_' + name)}"]:
                args += ["--set", o]
            out = run(args, ranks=None if ranks == 1 else ranks).stdout
            return losses(path(name + ".jsonl")), out

        for opt, (setting, kinds, per_parameter, (read, written)) in OPTIMIZERS.items():
            def same(name, ref, got, what):
                diff = checkpoints_differ(path(f"ck_{name}/step_000010"),
                                          path(f"ck_{ref}/step_000010"), kinds=kinds)
                check(losses_match(got, losses(path(ref + ".jsonl"))[-len(got):]) and
                      diff is None, f"{opt} {what}: {ref}'s losses and checkpoint, bitwise ({diff})")

            for d in (1, 2):
                grid = setting + [f"parallel.data={d}", "parallel.zero_stage=1"]
                train(d, f"{opt}_none{d}", grid)
                owned = PARAMS // d  # PARAMS is even: no padding at D = 2
                for place in ("host", "nvme"):
                    got, out = train(d, f"{opt}_{place}{d}", grid + where[place])
                    same(f"{opt}_{place}{d}", f"{opt}_none{d}", got, f"D={d} ZeRO-1 {place}")
                    line = f"({per_parameter} bytes for each of its {owned} owned parameters)"
                    check(line in out, f"{opt} D={d} {place}: the start-up line says {line}")
                    if place != "nvme":
                        continue
                    moved = {(r["offload_read_bytes"], r["offload_written_bytes"]) for r in got}
                    want = (read * owned, written * owned)
                    check(moved == {want}, f"{opt} D={d} nvme: {read} bytes read and {written} "
                                           f"written per owned parameter per step ({moved}, "
                                           f"{want} expected)")
            # ZeRO-3 with the parameter shard in a file too (the matrices' pass leaves it alone).
            zero3 = setting + ["parallel.data=2", "parallel.zero_stage=3"]
            train(2, f"{opt}_none_z3", zero3)
            got, _ = train(2, f"{opt}_params_z3",
                           zero3 + where["nvme"] + ["optimizer.offload_params=true"])
            same(f"{opt}_params_z3", f"{opt}_none_z3", got, "D=2 ZeRO-3 nvme with offload_params")
            check(not os.listdir(path("nvme")), f"{opt}: the state files are gone after the runs")

            resume = lambda src: [f"checkpoint.resume={path('ck_' + src)}/step_000005"]  # noqa: E731,E501
            for place in ("host", "nvme"):
                name = f"{opt}_none_to_{place}"
                got, _ = train(1, name, setting + where[place] + resume(f"{opt}_none1"))
                same(name, f"{opt}_none1", got, f"none's step 5 resumed into {place}")
                name = f"{opt}_{place}_to_none"
                got, _ = train(1, name, setting + resume(f"{opt}_{place}1"))
                same(name, f"{opt}_none1", got, f"{place}'s step 5 resumed into none")

        check_plan(trident, base)
    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")


def check_plan(trident, base):
    """The planner's device and host figures for stage 0 under optimizer.offload: host."""
    for setting, d, device, host in [
            (OPTIMIZERS["muon"][0], 2, 0, 16 * PARAMS // 2),
            (OPTIMIZERS["galore"][0], 1, galore_matrix_bytes(), 12 * PARAMS)]:
        args = [trident, "plan", "--json"] + base
        for o in setting + ["optimizer.offload=host", f"parallel.data={d}"]:
            args += ["--set", o]
        plan = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
        memory = json.loads(plan.stdout)["stages"][0]["memory_bytes"]
        check(memory["optimizer"] == device and memory["offloaded"] == host,
              f"the planner, {setting[0]} D={d} host: {device} bytes on the device, {host} in host "
              f"memory ({memory['optimizer']}, {memory['offloaded']})")


if __name__ == "__main__":
    main()
