#!/usr/bin/python3
"""The composition table: every feature of the parallel runtime with every other.

FEATURES below is the data: each feature is the `--set` overrides it needs, its grid among
them (parallel.pipeline, tensor, context, data). Each pairing (and each feature alone) is
merged into one config, and is then one of:
- n/a: the two set one key to two values (two schedules, two ZeRO stages, bf16 and fp16,
  selective and full recompute, ring and Ulysses): they cannot be asked for together;
- not built: this build does not know a key or value it needs (`trident plan` says so);
- refused: validation refuses it at start-up; `trident plan` runs the same checks as
  `trident train` (src/config/validate.cpp; plan skips only the CUDA device check, and the
  data and LoRA-base keys, all set here), so its one-line message is recorded without mpirun;
- one process: the config has no grid, so it is its own reference (it is run, and must run);
- equal: run for 2 steps on its grid under mpirun, its checkpoint (weights, fp32 master
  weights, the optimizer's state: Adam's moments, and Muon's momentum; every element, put
  together by checkpoint_compare.py) against ONE
  process's of the same global batch and the same training.* keys (precision, recompute,
  LoRA), the one-process references cached by those keys. fp32: every element within 1e-5 of
  its tensor's largest magnitude. Adam's eps is 1e-3 here (not 1e-8): at step 1 Adam moves
  every weight by ±lr whatever its gradient's size, so a gradient that is zero in exact
  arithmetic and 1e-10 after another reduction order moves its weight by the whole learning
  rate (measured against one process: on P=2 at eps 1e-4, 1.5e-5 of a bias's largest; at
  1e-3, 1.2e-6 on P=2 × M=2). bf16 and fp16: each step's loss within 2% of the one-process
  run of the same precision (what test_mixed_precision.py holds 16-bit layouts to), and every
  element of the checkpoint within 10% of its tensor's largest. A 16-bit sum in another order
  rounds by up to 2^-8 of the sum of its terms' magnitudes, not of the result, so no bound
  near fp32's holds; measured against one process: at most 3.1% (bf16, M=2, a bias whose
  largest is about the learning rate), and 2.0% in fp16; a wrong layout (each replica's
  samples shifted by one) differs by 70% to 170% in both, and passes the loss check alone.
A run that is accepted but fails or differs fails the test. So does a feature that is not
built unless NOT_BUILT_ALLOWED (or the env var TRIDENT_COMPOSITION_NOT_BUILT, comma-separated
feature ids) names it: after the features' branches merge, every feature must be built.

Then one run with P, M, C and D all 2 (16 ranks: 1F1B, sequence parallelism, ring attention,
ZeRO-1) against one process, the same way.

The results go to composition.json beside the trident binary; scripts/composition_table.py
renders README's table from them, and test_composition_table checks README against them.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_compare import KINDS  # noqa: E402
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures,  # noqa: E402
                         losses, run, tiny_run)

P2 = {"parallel.pipeline": "2"}
D2 = {"parallel.data": "2"}
SP = {"parallel.tensor": "2", "parallel.sequence_parallel": "true"}
# A llama mixture of experts: 4 routed experts of width 32, top-2, and one shared expert.
MOE = {"model.arch": "llama", "model.moe.experts": "4", "model.moe.top_k": "2",
       "model.moe.ffn_hidden": "32", "model.moe.shared_experts": "1"}
# (id, label, overrides). "{base}" is the one-process checkpoint LoRA adapts (of the same
# model.* keys).
FEATURES = [
    ("gpipe", "P=2 gpipe", {**P2, "parallel.schedule": "gpipe"}),
    ("1f1b", "P=2 1f1b", {**P2, "parallel.schedule": "1f1b"}),
    ("interleaved", "P=2 interleaved",
     {**P2, "parallel.schedule": "interleaved", "parallel.virtual_stages": "2"}),
    ("zb-h1", "P=2 zb-h1", {**P2, "parallel.schedule": "zb-h1"}),
    ("zb-h2", "P=2 zb-h2", {**P2, "parallel.schedule": "zb-h2"}),
    ("zb-v", "P=2 zb-v", {**P2, "parallel.schedule": "zb-v"}),
    ("tp", "M=2", {"parallel.tensor": "2"}),
    ("sp", "M=2 SP", SP),
    ("tp_overlap", "M=2 SP tp_overlap", {**SP, "parallel.tp_overlap": "true"}),
    ("ring", "C=2 ring", {"parallel.context": "2", "parallel.context_mode": "ring"}),
    ("ulysses", "C=2 Ulysses", {"parallel.context": "2", "parallel.context_mode": "ulysses"}),
    ("zero0", "D=2 ZeRO-0", {**D2, "parallel.zero_stage": "0"}),
    ("zero1", "D=2 ZeRO-1", {**D2, "parallel.zero_stage": "1"}),
    ("zero2", "D=2 ZeRO-2", {**D2, "parallel.zero_stage": "2"}),
    ("zero3", "D=2 ZeRO-3", {**D2, "parallel.zero_stage": "3"}),
    ("hsdp", "D=4 HSDP (shard 2, ZeRO-3)",
     {"parallel.data": "4", "parallel.data_shard": "2", "parallel.zero_stage": "3"}),
    ("selective", "recompute selective", {"training.recompute": "selective"}),
    ("full", "recompute full", {"training.recompute": "full"}),
    ("bf16", "bf16", {"training.precision": "bf16"}),
    ("fp16", "fp16", {"training.precision": "fp16"}),
    ("lora", "LoRA", {"training.lora.rank": "4", "model.init_from": "{base}"}),
    ("moe", "MoE (4 experts, top-2, shared)", MOE),
    ("ep", "MoE E=2 (D=2)", {**MOE, "parallel.expert": "2", "parallel.data": "2"}),
    ("muon", "Muon", {"optimizer.name": "muon"}),
    ("galore", "GaLore (rank 4)", {"optimizer.name": "galore", "optimizer.galore.rank": "4"}),
]
# Features whose keys are not on this build yet; each must leave this list once it is merged.
NOT_BUILT_ALLOWED = []
# The P = M = C = D = 2 run.
ALL_TWO = {"parallel.pipeline": "2", "parallel.tensor": "2", "parallel.context": "2",
           "parallel.data": "2", "parallel.schedule": "1f1b",
           "parallel.sequence_parallel": "true", "parallel.context_mode": "ring",
           "parallel.zero_stage": "1"}
# 4 layers (2 chunks of 1 per rank at P = 2 with two chunks each), hidden 32, 4 heads, sequence
# 16 (4 pieces at C = 2), 8 sequences a step in microbatches of 1: 2 per replica at D = 4, a
# multiple of P = 2.
BASE = ["model.layers=4", "training.global_batch=8", "training.micro_batch=1",
        "training.steps=2", "training.eps=1e-3", "checkpoint.interval=2"]
GRID = ("parallel.pipeline", "parallel.tensor", "parallel.context", "parallel.data")
FP32_RTOL, HALF_LOSS_RTOL, HALF_RTOL = 1e-5, 2e-2, 0.1
# The state each optimizer adds to AdamW's (checkpoint_compare.py's kinds) that is compared.
# GaLore's per-matrix state is not: its projector holds singular vectors of the gradient, which
# move by the gradient's change over the gap between singular values, so the last-bit
# differences of another layout's sums grow past 1e-5 in them (measured: 1.5e-5 of a
# projector's largest at D=2 ZeRO-3) while the weights they step stay within it.
# tests/python/test_galore.py compares that state element by element across a reshard, where
# the gradients are the same bits.
STATE = {"muon": ("momentum",)}


def merge(overrides):
    """The union of the overrides, or None where two set one key to different values."""
    out = {}
    for o in overrides:
        for k, v in o.items():
            if out.setdefault(k, v) != v:
                return None
    return out


def ranks(config):
    n = 1
    for k in GRID:
        n *= int(config.get(k, "1"))
    return n


def refusal(trident, base, config):
    """None where `trident plan` accepts the config; else (kind, message): kind "not built"
    for a key or value this build does not know, else "refused"."""
    p = run([trident, "plan"] + base + sets(config), expect_ok=False)
    if p.returncode == 0:
        return None
    lines = [l for l in p.stdout.splitlines() if l.startswith("trident: error:")]
    message = lines[-1] if lines else p.stdout.strip().splitlines()[-1]
    message = re.sub(r"^trident: error: (--set \S+: )?", "", message)
    unknown = re.match(r"(\S+): (unknown key|expected one of .*; got \"(.*)\")$", message)
    if unknown and (unknown[2] == "unknown key" or config.get(unknown[1]) == unknown[3]):
        return "not built", message
    return "refused", message


def sets(config):
    return [a for k, v in sorted(config.items()) for a in ("--set", f"{k}={v}")]


class Runner:
    """Trains configs in `tmp`, one-process references cached by their training keys."""

    def __init__(self, trident, tmp):
        self.trident, self.tmp, self.count = trident, tmp, 0
        self.base = tiny_run(tmp, BASE)
        self.references = {}
        self.bases = {}

    def train(self, config):
        """(return code and output, the last checkpoint) of one run of the config."""
        self.count += 1
        ck = os.path.join(self.tmp, f"ck{self.count}")
        n = ranks(config)
        p = run([self.trident, "train"] + self.base + sets({**config, "checkpoint.dir": ck}),
                ranks=n if n > 1 else None, expect_ok=False)
        steps = config.get("training.steps", "2")
        return p, os.path.join(ck, f"step_{int(steps):06d}")

    def lora_base(self, config):
        """The weights LoRA adapts: one fp32 step of the config's model (its model.* keys)."""
        model = tuple(sorted((k, v) for k, v in config.items()
                             if k.startswith("model.") and k != "model.init_from"))
        if model not in self.bases:
            p, ck = self.train({**dict(model), "checkpoint.interval": "1", "training.steps": "1"})
            if p.returncode != 0:
                print(p.stdout)
                raise SystemExit(f"LoRA's base {model} failed")
            self.bases[model] = ck
        return self.bases[model]

    def resolve(self, config):
        if "{base}" not in config.values():
            return config
        base = self.lora_base(config)
        return {k: v.replace("{base}", base) for k, v in config.items()}

    def reference(self, config):
        key = tuple(sorted((k, v) for k, v in config.items() if not k.startswith("parallel.")))
        if key not in self.references:
            p, ck = self.train(dict(key))
            if p.returncode != 0:
                print(p.stdout)
                raise SystemExit(f"one-process reference {key} failed")
            self.references[key] = ck
        return self.references[key]

    def compare(self, config):
        """(status, detail) of a config `trident plan` accepts: run and compared."""
        config = self.resolve(config)
        ref = self.reference(config)  # one run, which fails the test should it fail
        if ranks(config) == 1:
            return "one process", ""
        started = time.monotonic()
        p, ck = self.train(config)
        seconds = time.monotonic() - started
        if p.returncode != 0:
            return "failed", tail(p.stdout)
        detail = f"{ranks(config)} ranks, {seconds:.1f} s"
        kinds = KINDS + STATE.get(config.get("optimizer.name"), ())
        differ = differs(ck, ref, config.get("training.precision", "fp32") != "fp32", kinds)
        shutil.rmtree(os.path.dirname(ck))
        return ("equal", detail) if differ is None else ("differs", f"{detail}: {differ}")


def differs(ck, ref, half, kinds):
    """None where checkpoint `ck` is equal to the one-process `ref` in `kinds` (the module's
    docstring says how), else the first difference."""
    if not half:
        return checkpoints_differ(ck, ref, FP32_RTOL, kinds)
    rows, want = (losses(os.path.join(os.path.dirname(c), "metrics.jsonl")) for c in (ck, ref))
    worst = max((abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(rows, want)),
                default=float("inf"))
    if len(rows) != len(want) or not worst <= HALF_LOSS_RTOL:
        return f"losses {[r['loss'] for r in rows]} against {[r['loss'] for r in want]}"
    return checkpoints_differ(ck, ref, HALF_RTOL, kinds)


def tail(text):
    return " | ".join(text.strip().splitlines()[-3:])


def cells(trident, runner):
    """{"a|b": {status, message}} for every pairing and every feature alone (a|a)."""
    out, seen = {}, {}
    for (a, _, oa), (b, _, ob) in itertools.combinations_with_replacement(FEATURES, 2):
        config = merge([oa, ob])
        if config is None:
            out[f"{a}|{b}"] = {"status": "n/a", "message": ""}
            continue
        key = tuple(sorted(config.items()))
        if key not in seen:
            refused = refusal(trident, runner.base, runner.resolve(config))
            seen[key] = refused or runner.compare(config)
        status, message = seen[key]
        out[f"{a}|{b}"] = {"status": status, "message": message}
        print(f"{a} x {b}: {status} {message}", flush=True)
    return out


def check_cells(table, allowed):
    for pair, cell in table.items():
        a, b = pair.split("|")
        name = a if a == b else f"{a} x {b}"
        if cell["status"] in ("failed", "differs"):
            check(False, f"{name}: accepted but {cell['status']}: {cell['message']}")
        if a == b and cell["status"] == "not built":
            check(a in allowed, f"{a}: not built ({cell['message']})"
                  + ("; allowed by NOT_BUILT_ALLOWED" if a in allowed else ""))
    counts = {}
    for cell in table.values():
        counts[cell["status"]] = counts.get(cell["status"], 0) + 1
    print("cells:", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for feature in allowed:
        if table.get(f"{feature}|{feature}", {}).get("status") != "not built":
            check(False, f"{feature} is built now: take it off NOT_BUILT_ALLOWED")


def all_two(runner):
    status, detail = runner.compare(ALL_TWO)
    check(status == "equal", f"P=M=C=D=2 (16 ranks; 1f1b, SP, ring, ZeRO-1): checkpoint within "
                             f"{FP32_RTOL} of one process, every element ({status}: {detail})")
    return {"status": status, "message": detail}


def main():
    trident, _ = binaries_or_skip()
    env = os.environ.get("TRIDENT_COMPOSITION_NOT_BUILT")
    allowed = env.split(",") if env is not None else NOT_BUILT_ALLOWED
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        runner = Runner(trident, tmp)
        table = cells(trident, runner)
        check_cells(table, allowed)
        everything = all_two(runner)
    results = {"features": [{"id": f, "label": label} for f, label, _ in FEATURES],
               "cells": table, "all_two": everything,
               "seconds": round(time.monotonic() - started, 1)}
    out = os.path.join(os.path.dirname(os.path.abspath(trident)), "composition.json")
    with open(out, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(f"results: {out} ({results['seconds']} s)")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
