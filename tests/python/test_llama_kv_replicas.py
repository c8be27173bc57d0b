#!/usr/bin/python3
"""Tensor parallelism with fewer key/value heads than tensor ranks (model.kv_heads < M): each
key/value head is held whole by the M / kv_heads ranks of its query heads and its gradient
summed among them (model/param_layout.h). A llama model of 4 heads, under mpirun:

- kv_heads 1 with M = 2, M = 4 with sequence parallelism, M = 2 with D = 2 ZeRO-1 and ZeRO-3,
  M = 2 with P = 2, and M = 2 with C = 2 Ulysses (1 key/value head over M·C = 4 ranks); kv_heads 2 with
  M = 4: the 10-step losses and the printed gradient norms within 1e-5 relative of one process
  (a replica's gradient counted twice in the norm, or not summed, shows here); with M = 4
  (kv_heads 1 and 2) the bytes the replicas' all-reduces move per step, and rank 0's parameter,
  gradient and optimizer bytes, equal `trident plan`'s;
- the loss and every gradient of one batch within 1e-5 for kv_heads 1, M = 4 and kv_heads 2,
  M = 4 with sequence parallelism;
- a checkpoint written at M = 4, kv_heads 2 holds every element of every tensor once (each
  head's rows written by one replica), put together by tests/python/checkpoint_compare.py; its
  weights equal bit for bit those `trident export` reshards it to (M = 1); and resumed at
  M = 1 and M = 2 it continues on one process's losses and gradient norms within 1e-5;
- training.check_replicas names a key/value head replica that differs from the others.
Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import array
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint_compare  # noqa: E402
from mpi_harness import (binaries_or_skip, check, failures, losses, mpirun_env,  # noqa: E402
                         read_safetensors, run, tiny_run, worst_tensor_diff)

LLAMA = ["model.arch=llama", "model.layers=4", "model.ffn_hidden=48", "model.rope_theta=500000"]

# (name, kv_heads, ranks, overrides)
LAYOUTS = [
    ("kv 1, M=2", 1, 2, ["parallel.tensor=2"]),
    ("kv 1, M=4 +SP", 1, 4, ["parallel.tensor=4", "parallel.sequence_parallel=true"]),
    ("kv 1, M=2 D=2 ZeRO-1", 1, 4, ["parallel.tensor=2", "parallel.data=2",
                                    "parallel.zero_stage=1"]),
    ("kv 1, M=2 D=2 ZeRO-3", 1, 4, ["parallel.tensor=2", "parallel.data=2",
                                    "parallel.zero_stage=3"]),
    ("kv 1, M=2 P=2", 1, 4, ["parallel.tensor=2", "parallel.pipeline=2"]),
    ("kv 1, M=2 C=2 ulysses", 1, 4, ["parallel.tensor=2", "parallel.context=2",
                                     "parallel.context_mode=ulysses"]),
]
GRADIENTS = [
    ("kv 1, M=4", 1, 4, ["parallel.tensor=4"]),
    ("kv 2, M=4 +SP", 2, 4, ["parallel.tensor=4", "parallel.sequence_parallel=true"]),
]


def sets(overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def rows(path):
    return [r for r in losses(path) if "loss" in r]


def worst_rel(got, ref, key):
    if len(got) != len(ref):
        return float("inf")
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(got, ref))


def check_curve(name, got, ref):
    for key in ("loss", "grad_norm"):
        worst = worst_rel(got, ref, key)
        check(worst <= 1e-5, f"{name}: {len(ref)} steps' {key} within 1e-5 of one process "
                             f"(worst {worst:.2e})")


def check_plan(trident, name, base, overrides, got):
    """Every step's measured key/value replica all-reduce bytes, and rank 0's parameter,
    gradient and optimizer bytes (replicas held on every rank), equal `trident plan`'s."""
    out = run([trident, "plan", "--json"] + base + sets(overrides)).stdout
    stage = json.loads(out)["stages"][0]
    planned = stage["communication"]["kv-replica"]["payload_bytes"]
    measured = {r["kv_all_reduce_bytes"] for r in got}
    check(measured == {planned} and planned > 0,
          f"{name}: key/value replica all-reduce bytes per step {sorted(measured)} = the "
          f"plan's {planned}")
    memory = stage["memory_bytes"]
    pairs = [(got[0][f"mem_{kind}_bytes"], memory[key])
             for kind, key in (("params", "weights"), ("grads", "gradients"),
                               ("optimizer", "optimizer"))]
    check(all(a == b for a, b in pairs),
          f"{name}: rank 0's parameter, gradient and optimizer bytes (measured, planned) {pairs}")


def corrupt_kv_replica(trident, base):
    """A bit flipped in rank 1's copy of the key/value head it shares with rank 0
    (TRIDENT_TEST_CORRUPT_REPLICA) before the replica check of step 4: the run stops, naming
    both ranks and the tensor."""
    env = dict(mpirun_env(), TRIDENT_TEST_CORRUPT_REPLICA="4:1:layers.0.self_attn.k_proj.weight")
    cmd = [shutil.which("mpirun"), "--oversubscribe", "-np", "2", trident, "train"] + base + sets(
        ["parallel.tensor=2", "training.steps=4", "training.check_replicas=2"])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=600)
    said = ("training.check_replicas: at step 4 the key/value head replicas disagree: rank 1 "
            "(pp 0, tp 1, dp 0) holds another layers.0.self_attn.k_proj.weight than rank 0 "
            "(pp 0, tp 0, dp 0)")
    check(p.returncode == 1 and said in p.stdout,
          f"kv 1, M=2: a flipped bit in one replica of a key/value head named (exit "
          f"{p.returncode})")


def main():
    trident, dump = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = {kv: tiny_run(tmp, LLAMA + [f"model.kv_heads={kv}"]) for kv in (1, 2)}
        # One process per kv_heads: the reference curves, and checkpoints at step 5 (the
        # gradients start from them, the resharding compares with them).
        reference = {}
        for kv in (1, 2):
            run([trident, "train"] + base[kv] + sets([f"logging.metrics={path(f'm1_{kv}.jsonl')}",
                                                      f"checkpoint.dir={path(f'ck1_{kv}')}",
                                                      "checkpoint.interval=5"]), ranks=1)
            reference[kv] = rows(path(f"m1_{kv}.jsonl"))
            check(len(reference[kv]) == 10, f"one process, kv {kv}: 10 steps")
        for i, (name, kv, ranks, overrides) in enumerate(LAYOUTS):
            metrics = path(f"m_{i}.jsonl")
            run([trident, "train"] + base[kv] + sets(overrides + [f"logging.metrics={metrics}"]),
                ranks=ranks)
            check_curve(name, rows(metrics), reference[kv])
            if "SP" in name:
                check_plan(trident, name, base[kv], overrides, rows(metrics))
        corrupt_kv_replica(trident, base[1])
        # kv_heads 2 at M = 4, checkpointed at step 5 and 10.
        run([trident, "train"] + base[2] + sets(["parallel.tensor=4", f"checkpoint.dir={path('ck4')}",
                                                 "checkpoint.interval=5",
                                                 f"logging.metrics={path('m4.jsonl')}"]), ranks=4)
        check_curve("kv 2, M=4", rows(path("m4.jsonl")), reference[2])
        check_plan(trident, "kv 2, M=4", base[2], ["parallel.tensor=4"],
                         rows(path("m4.jsonl")))
        # The loss and every gradient of one global batch.
        for name, kv, ranks, overrides in GRADIENTS:
            init = sets([f"model.init_from={path(f'ck1_{kv}/step_000005')}"])
            ref_out, out = path(f"g1_{kv}.safetensors"), path(f"g_{name[3]}.safetensors")
            if not os.path.exists(ref_out):
                run([dump] + base[kv] + init + ["--output", ref_out], ranks=1)
            ref_grads = read_safetensors(ref_out)
            run([dump] + base[kv] + init + sets(overrides) + ["--output", out], ranks=ranks)
            got = read_safetensors(out)
            worst = worst_tensor_diff(got, ref_grads)
            check(sorted(got) == sorted(ref_grads) and worst[0] <= 1e-5,
                  f"{name}: loss and {len(ref_grads) - 1} gradients within 1e-5 "
                  f"(worst {worst[0]:.2e}, {worst[1]})")
        # The M = 4 checkpoint, put together by checkpoint_compare (every element of every
        # tensor written by exactly one shard: one replica writes each key/value head), equals
        # bit for bit what `trident export` reshards it to (the whole model, M = 1).
        try:
            shards, _ = checkpoint_compare.load(path("ck4/step_000005"))
            whole = shards["param"]
        except ValueError as e:
            check(False, f"kv 2, M=4 checkpoint: every element written once ({e})")
            whole = {}
        run([trident, "export", "--checkpoint", path("ck4/step_000005"), "--output",
             path("hf4.safetensors")])
        hf = read_safetensors(path("hf4.safetensors"))
        unequal = [n for n in hf if n.removeprefix("model.") not in whole or
                   array.array("I", hf[n].tobytes()) != whole[n.removeprefix("model.")][:len(hf[n])]]
        check(whole and not unequal and len(hf) == len(whole),
              f"kv 2, M=4 checkpoint: each element written once, and its {len(whole)} tensors "
              f"bitwise those exported at M = 1 (differ: {unequal})")
        # Resumed at M = 1 and M = 2 from the M = 4 checkpoint of step 5.
        shutil.rmtree(path("ck4/step_000010"))
        for m in (1, 2):
            ck = path(f"ck4_{m}")
            shutil.copytree(path("ck4"), ck)
            metrics = path(f"resumed_{m}.jsonl")
            run([trident, "train"] + base[2] + sets([f"parallel.tensor={m}", f"checkpoint.dir={ck}",
                                                     f"logging.metrics={metrics}"]), ranks=m)
            check_curve(f"kv 2, M=4 checkpoint resumed at M={m}", rows(metrics),
                        reference[2][5:])
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
