#!/usr/bin/python3
"""The optimizer state in host memory with its Adam step on the host (optimizer.offload: host)
against none, on the CPU backend, which runs the host path the GPU runs (its copies are
memcpy there).

- Losses and checkpoint tensors (weights, fp32 master weights, Adam's moments) bitwise equal
  to no offload, element by element: D = 1; D = 2 with ZeRO-1, the state visited in chunks
  smaller than it; D = 2 with ZeRO-2. The host update splits its whole-state chunks over 2
  threads (8,192 elements a thread at least: the 4,000-element chunks stay on one).
- bf16 training (16-bit parameters and gradients: the weights come back rounded on the host):
  bitwise equal to none's bf16 run, losses and checkpoint.
- Checkpoints save from and resume into host state: a host run's step-5 checkpoint resumed
  into none, and a none run's into host, each bitwise none's uninterrupted run at step 10.
- The planner (`trident plan --json`, D = 2): no optimizer state on the device, and 12 bytes
  per owned parameter in host memory, the parameter count from the model's shape
  (Vp·C + T·C + L·(12C² + 13C) + 2C, Vp the vocabulary padded to 128), over D.

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

HOST = ["optimizer.offload=host"]
V, T, C, L = 300, 16, 32, 2
VP = (V + 127) // 128 * 128  # the embedding's rows: the vocabulary padded to 128
PARAMS = VP * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        # 2 threads: the host update splits its chunks (none's runs alike, the same OpenBLAS).
        base = tiny_run(tmp, ["checkpoint.interval=5", "checkpoint.keep=10",
                              "training.threads=2"])

        def train(ranks, name, overrides):
            args = [trident, "train"] + base
            for o in overrides + [f"logging.metrics={path(name + '.jsonl')}",
                                  f"checkpoint.dir={path('ck_' + name)}"]:
                args += ["--set", o]
            run(args, ranks=None if ranks == 1 else ranks)
            return losses(path(name + ".jsonl"))

        def same(name, ref, got, what):
            diff = checkpoints_differ(path(f"ck_{name}/step_000010"),
                                      path(f"ck_{ref}/step_000010"))
            check(losses_match(got, losses(path(ref + ".jsonl"))[-len(got):]) and diff is None,
                  f"{what}: {ref}'s losses and checkpoint, bitwise ({diff})")

        for d, stage, extra in [(1, 1, []), (2, 1, ["optimizer.offload_chunk=4000"]),
                                (2, 2, []), (1, 1, ["training.precision=bf16"])]:
            grid = [f"parallel.data={d}", f"parallel.zero_stage={stage}"]
            tag = f"{d}{stage}" + ("bf16" if extra and "bf16" in extra[0] else "")
            train(d, f"none{tag}", grid + [e for e in extra if "offload" not in e])
            got = train(d, f"host{tag}", grid + extra + HOST)
            same(f"host{tag}", f"none{tag}", got, f"D={d} ZeRO-{stage} {' '.join(extra)}: host")

        resume = lambda src: [f"checkpoint.resume={path('ck_' + src)}/step_000005"]  # noqa: E731
        same("host_to_none", "none11", train(1, "host_to_none", resume("host11")),
             "host's step 5 resumed into none")
        same("none_to_host", "none11", train(1, "none_to_host", HOST + resume("none11")),
             "none's step 5 resumed into host")

        plan = subprocess.run([trident, "plan", "--json"] + base +
                              ["--set", HOST[0], "--set", "parallel.data=2"],
                              stdout=subprocess.PIPE, text=True, check=True)
        memory = json.loads(plan.stdout)["stages"][0]["memory_bytes"]
        check(memory["optimizer"] == 0 and memory["offloaded"] == 12 * PARAMS // 2,
              f"the planner: no optimizer state on the device, 12 bytes per owned parameter "
              f"on the host ({memory['optimizer']}, {memory['offloaded']}; "
              f"{12 * PARAMS // 2} expected)")
    if failures:
        raise SystemExit(f"{len(failures)} check(s) failed")


if __name__ == "__main__":
    main()
