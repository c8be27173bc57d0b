#!/usr/bin/python3
"""Low-rank adapters (training.lora) under ZeRO-2 and ZeRO-3, against one process.

At ZeRO-2 the adapters' gradients and optimizer state are sharded over the D replicas and the
frozen base stays whole; at ZeRO-3 the adapters and the base are sharded too. For GPT-2 (four
targets) and llama (seven), four AdamW steps of two microbatches per replica:

1. D = 2 at ZeRO-2 and at ZeRO-3: the checkpoint's adapters, fp32 master weights and Adam's
   moments, element by element, within 1e-5 (relative to each tensor's largest) of one
   process's (D = 2 sums the gradients in another order); ZeRO-3's bitwise ZeRO-2's (the same
   reductions). GPT-2 also with P = 2 at ZeRO-2 (whole gradients until the last microbatch)
   and M = 2 at ZeRO-3 (the replicas' check every step, which gathers the sharded base),
   4 ranks each.
2. Resharding: ZeRO-3's checkpoint of step 2 resumed at ZeRO-1 on D = 2 and on one process
   gives one process's step 4 (1e-5).
3. The planner's weights, gradients and optimizer bytes of rank 0 (`trident plan --json`)
   are the bytes the runs measured, to the byte: base whole at ZeRO-2, a D-th at ZeRO-3.

Exit status: 0 passed, 1 a check failed, 77 skipped (no numpy or mpirun).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError as e:
    print(f"SKIP: needs Debian's python3-numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
import llama_reference  # noqa: E402
from lora_training import curve  # noqa: E402
from mpi_harness import binaries_or_skip, check, checkpoints_differ, failures, run  # noqa: E402

SHAPE = ref.GPTShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, ffn=128)
LLAMA = llama_reference.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4,
                                   kv_heads=2, ffn=48, rope_theta=500000.0, norm_eps=1e-6)
RANK, ALPHA = 4, 8.0
TRAINING = {"micro_batch": 2, "global_batch": 8, "steps": 4, "lr": 5e-3, "min_lr": 5e-4,
            "warmup_steps": 1, "decay": "cosine", "weight_decay": 0.1, "beta1": 0.9,
            "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.2, "threads": 1}
# Adapted linears, (PEFT name of layer l's module, in, out).
GPT2_TARGETS = [("attn.c_attn", 32, 96), ("attn.c_proj", 32, 32), ("mlp.c_fc", 32, 128),
                ("mlp.c_proj", 128, 32)]
LLAMA_TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]


def adapters_file(path, rng, linears):
    """Adapters with B non-zero, so that every factor has a gradient from the first step."""
    adapters = {}
    for name, fan_in, fan_out in linears:
        adapters[name + ".lora_A.weight"] = (
            rng.uniform(-1, 1, (RANK, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
        adapters[name + ".lora_B.weight"] = (
            0.02 * rng.standard_normal((fan_out, RANK))).astype(np.float32)
    ref.write_safetensors(path, adapters)


def write_gpt2(path, rng):
    model = ref.GPT2Reference(SHAPE)
    ref.random_init(model, 3)
    ref.round_to_float32(model)
    ref.save_hf_weights(model, path("base.safetensors"), with_prefix=True)
    adapters_file(path("adapters.safetensors"), rng,
                  [(f"base_model.model.transformer.h.{l}.{n}", i, o)
                   for l in range(SHAPE.layers) for n, i, o in GPT2_TARGETS])
    return {"vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len, "layers": SHAPE.layers,
            "hidden": SHAPE.hidden, "heads": SHAPE.heads, "ffn_hidden": SHAPE.ffn}, []


def write_llama(path, rng):
    s = LLAMA
    model = llama_reference.LlamaReference(s)
    llama_reference.random_init(model, 3)
    llama_reference.save_hf_weights(model, path("base.safetensors"))
    kv = s.hidden // s.heads * s.kv_heads
    shapes = {"q": (s.hidden, s.hidden), "k": (s.hidden, kv), "v": (s.hidden, kv),
              "o": (s.hidden, s.hidden), "gate": (s.hidden, s.ffn), "up": (s.hidden, s.ffn),
              "down": (s.ffn, s.hidden)}
    adapters_file(path("adapters.safetensors"), rng,
                  [("base_model.model.model." + llama_reference.lora_name(l, t),) + shapes[t]
                   for l in range(s.layers) for t in LLAMA_TARGETS])
    return ({"arch": "llama", "vocab_size": s.vocab, "seq_len": s.seq_len, "layers": s.layers,
             "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads, "ffn_hidden": s.ffn,
             "rope_theta": s.rope_theta, "norm_eps": s.norm_eps},
            [f"training.lora.targets=[{', '.join(LLAMA_TARGETS)}]"])


def planned_vs_measured(trident, base, overrides, metrics):
    """Rank 0's weights, gradients and optimizer bytes: (planned, measured)."""
    args = [trident, "plan", "--json"] + base
    for o in overrides:
        args += ["--set", o]
    p = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
    stage = json.loads(p.stdout)["stages"][0]["memory_bytes"]
    last = curve(metrics)[-1]
    return ((stage["weights"], stage["gradients"], stage["optimizer"]),
            (last["mem_params_bytes"], last["mem_grads_bytes"], last["mem_optimizer_bytes"]))


def check_arch(trident, tmp, arch):
    path = lambda name: os.path.join(tmp, arch, name)  # noqa: E731
    os.makedirs(path(""))
    rng = np.random.default_rng(7)
    tokens = np.tile(rng.integers(0, SHAPE.vocab, size=80), 5)
    ref.write_llmc_shard(path("train.bin"), tokens)
    model, extra = (write_gpt2 if arch == "gpt2" else write_llama)(path, rng)
    model["init_from"] = path("base.safetensors")
    ref.write_config(path("c.yaml"), {"model": model, "training": TRAINING,
                                      "data": {"train": path("train.bin"), "shuffle": False},
                                      "checkpoint": {"interval": 2}, "device": "cpu"})
    lora = (f"training.lora={{rank: {RANK}, alpha: {ALPHA}, "
            f"init_from: {path('adapters.safetensors')}}}")
    base = ["--config", path("c.yaml"), "--set", lora] + [a for o in extra for a in ("--set", o)]

    def train(name, overrides=(), ranks=1):
        args = [trident, "train"] + base + ["--set", f"logging.metrics={path(name)}.jsonl",
                                            "--set", f"checkpoint.dir={path(name)}"]
        for o in overrides:
            args += ["--set", o]
        run(args, ranks=ranks)
        return path(name)

    def step(run_dir, n):
        return os.path.join(run_dir, f"step_{n:06d}")

    one = train("one")
    runs = {}
    layouts = [("D=2 ZeRO-2", ["parallel.data=2", "parallel.zero_stage=2"], 2),
               ("D=2 ZeRO-3", ["parallel.data=2", "parallel.zero_stage=3"], 2)]
    if arch == "gpt2":
        layouts += [("P=2 D=2 ZeRO-2, whole gradients until the last microbatch",
                     ["parallel.pipeline=2", "parallel.data=2", "parallel.zero_stage=2",
                      "parallel.sharded_accumulation=false"], 4),
                    ("M=2 D=2 ZeRO-3, replicas checked every step",
                     ["parallel.tensor=2", "parallel.data=2", "parallel.zero_stage=3",
                      "training.check_replicas=1"], 4)]
    for i, (name, overrides, ranks) in enumerate(layouts):
        runs[name] = train(f"l{i}", overrides, ranks)
        diff = checkpoints_differ(step(runs[name], 4), step(one, 4), rtol=1e-5)
        check(diff is None, f"{arch} {name}: adapters and optimizer state of one process within "
                            f"1e-5: {diff or 'every element'}")
        if ranks == 2:
            planned, measured = planned_vs_measured(trident, base, overrides,
                                                    path(f"l{i}") + ".jsonl")
            check(planned == measured, f"{arch} {name}: planned weights, gradients, optimizer "
                                       f"bytes {planned} = measured {measured}")
    diff = checkpoints_differ(step(runs["D=2 ZeRO-3"], 4), step(runs["D=2 ZeRO-2"], 4))
    check(diff is None, f"{arch}: ZeRO-3's checkpoint bitwise ZeRO-2's: {diff or 'every element'}")
    if arch != "gpt2":
        return
    # 2. ZeRO-3's step 2 resumed at ZeRO-1 (D = 2) and on one process.
    for i, (name, overrides, ranks) in enumerate([
            ("ZeRO-1 D=2", ["parallel.data=2", "parallel.zero_stage=1"], 2),
            ("one process", [], 1)]):
        resumed = path(f"resumed{i}")
        shutil.copytree(step(runs["D=2 ZeRO-3"], 2), step(resumed, 2))
        train(f"resumed{i}", overrides, ranks)
        diff = checkpoints_differ(step(resumed, 4), step(one, 4), rtol=1e-5)
        check(diff is None, f"{arch}: ZeRO-3's step 2 resumed at {name}: one process's step 4 "
                            f"within 1e-5: {diff or 'every element'}")


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("gpt2", "llama"):
            check_arch(trident, tmp, arch)
    if failures:
        print(f"FAILED {len(failures)} check(s)")
        return 1
    print("all LoRA ZeRO-2/3 checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
