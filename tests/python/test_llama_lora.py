#!/usr/bin/python3
"""Low-rank adapters of llama's linears (training.lora with model.arch: llama, targets q, k, v,
o, gate, up, down) against PyTorch and across layouts.

1. A float64 PyTorch LoRA over the reference Llama (llama_reference.py: 4 heads, 2 key/value
   heads, an untied head), from the same base weights and adapters file (B non-zero, every
   target): the loss and every adapter gradient of one global batch within 1e-5, and ten
   AdamW steps' losses within 1e-5 (gradient norms 1e-4).
2. Every layout family trains the same adapters: the ten losses of P = 2 (1F1B with full
   recompute, ZB-H1), D = 2 (ZeRO 0 with selective recompute, ZeRO 1) and C = 2 (ring) within
   1e-5 of one process, and the loss and adapters' gradients of one batch under M = 2; with
   the adapters' dropout (0.1), M = 2 with sequence parallelism and C = 2 with Ulysses draw one
   process's masks (ten losses within 1e-5 of one process with dropout).
3. GPT-2's target names are refused for a llama.
4. Checkpoints: resumed on M = 2 from one process's step 5, the uninterrupted losses (1e-5);
   `export --merge-lora` writes Hugging Face Llama tensors W + (alpha/r)·B·A (1e-6 of numpy's
   merge) that load (model.init_from) to the adapted loss; `export --lora-only` writes PEFT's
   Llama names, with PEFT's adapter_config.json (PEFT's merge by its rules is --merge-lora's),
   that load back (training.lora.init_from) to the same loss and, merged by
   `generate --checkpoint BASE --lora`, give the adapters' checkpoint's text (over a checkpoint
   of adapters, --lora is refused); changed base weights are refused (SHA-256).

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch, numpy or mpirun).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: needs Debian's python3-torch ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as common  # noqa: E402
import llama_reference as ref  # noqa: E402
from lora_training import curve, reference_training, worst_rel  # noqa: E402
from mpi_harness import binaries_or_skip, check, failures, run  # noqa: E402
from peft_check import check_peft_export  # noqa: E402

SHAPE = ref.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2, ffn=48,
                       rope_theta=500000.0, norm_eps=1e-6)
RANK, ALPHA = 4, 8.0
TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]
TRAINING = {"micro_batch": 2, "global_batch": 4, "steps": 10, "lr": 5e-3, "min_lr": 5e-4,
            "warmup_steps": 2, "decay": "cosine", "weight_decay": 0.1, "beta1": 0.9,
            "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.2, "threads": 1}
PEFT = "base_model.model.model."
# M = 2 without sequence parallelism is the one-batch gradient check and the resume below;
# recompute rides on two of the others; M = 2 with sequence parallelism and C = 2 Ulysses run
# with the adapters' dropout, against one process with it.
LAYOUTS = [("P=2 1f1b, full recompute", ["parallel.pipeline=2", "training.recompute=full"], 2),
           ("P=2 zb-h1", ["parallel.pipeline=2", "parallel.schedule=zb-h1"], 2),
           ("D=2 ZeRO-0, selective recompute", ["parallel.data=2", "parallel.zero_stage=0",
                                                "training.recompute=selective"], 2),
           ("D=2 ZeRO-1", ["parallel.data=2", "parallel.zero_stage=1"], 2),
           ("C=2 ring", ["parallel.context=2"], 2)]
DROPOUT_LAYOUTS = [("M=2 +SP", ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
                   ("C=2 ulysses", ["parallel.context=2", "parallel.context_mode=ulysses"])]


def linear_shape(target):
    """(out, in) of the linear a target adapts."""
    kv = SHAPE.hidden // SHAPE.heads * SHAPE.kv_heads
    return {"q": (SHAPE.hidden, SHAPE.hidden), "k": (kv, SHAPE.hidden),
            "v": (kv, SHAPE.hidden), "o": (SHAPE.hidden, SHAPE.hidden),
            "gate": (SHAPE.ffn, SHAPE.hidden), "up": (SHAPE.ffn, SHAPE.hidden),
            "down": (SHAPE.hidden, SHAPE.ffn)}[target]


def adapted_reference(base_seed, adapters):
    model = ref.LlamaReference(SHAPE)
    ref.random_init(model, base_seed)
    ours = {n[len(PEFT):]: a for n, a in adapters.items()}
    return ref.add_lora(model, ours, TARGETS, ALPHA / RANK)


def write_inputs(path, rng):
    """Tokens, base weights (seed 3) and adapters of every target with B non-zero."""
    tokens = np.tile(rng.integers(0, SHAPE.vocab, size=80), 5)
    common.write_llmc_shard(path("train.bin"), tokens)
    base_model = ref.LlamaReference(SHAPE)
    ref.random_init(base_model, 3)
    ref.save_hf_weights(base_model, path("base.safetensors"))
    adapters = {}
    for layer in range(SHAPE.layers):
        for target in TARGETS:
            out, fan_in = linear_shape(target)
            stem = PEFT + ref.lora_name(layer, target)
            adapters[stem + ".lora_A.weight"] = (
                rng.uniform(-1, 1, (RANK, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            adapters[stem + ".lora_B.weight"] = (
                0.02 * rng.standard_normal((out, RANK))).astype(np.float32)
    common.write_safetensors(path("adapters.safetensors"), adapters)
    common.write_config(path("c.yaml"), {
        "model": {"arch": "llama", "vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len,
                  "layers": SHAPE.layers, "hidden": SHAPE.hidden, "heads": SHAPE.heads,
                  "kv_heads": SHAPE.kv_heads, "ffn_hidden": SHAPE.ffn,
                  "rope_theta": SHAPE.rope_theta, "norm_eps": SHAPE.norm_eps,
                  "init_from": path("base.safetensors")},
        "training": TRAINING,
        "data": {"train": path("train.bin"), "shuffle": False},
        "device": "cpu"})
    return tokens, adapters


def check_reference(dump, base, path, tokens, adapters, train):
    """1. PyTorch: one batch's loss and adapter gradients, then ten steps. Returns the
    losses of one process."""
    run([dump] + base + ["--output", path("g1.safetensors")], ranks=1)
    got, _ = common.read_safetensors(path("g1.safetensors"))
    model = adapted_reference(3, adapters)
    inputs, targets = common.step_batch(tokens, 0, TRAINING["global_batch"], SHAPE.seq_len)
    loss = model.loss(inputs, targets)
    loss.backward()
    check(abs(float(got["loss"][0]) - loss.item()) <= 1e-5 * loss.item(),
          f"PyTorch: one batch's loss {float(got['loss'][0]):.7f} vs {loss.item():.7f}")
    factors = ref.lora_parameters(model, TARGETS)
    worst = max((common.relative_error(got.get(n, np.zeros(0)), p.grad.numpy()), n)
                for n, p in factors)
    check(worst[0] <= 1e-5 and sorted(got) == sorted(["loss"] + [n for n, _ in factors]),
          f"PyTorch: every adapter gradient ({len(factors)}) within 1e-5 "
          f"(worst {worst[0]:.2e}, {worst[1]})")
    train("m1")
    ours = curve(path("m1.jsonl"))
    trained = adapted_reference(3, adapters)
    want = reference_training(trained, [p for _, p in ref.lora_parameters(trained, TARGETS)],
                              tokens, TRAINING, SHAPE.seq_len)
    worst = worst_rel([r["loss"] for r in ours], [w[0] for w in want])
    check(worst <= 1e-5, f"PyTorch: ten steps' losses within 1e-5 (worst {worst:.2e})")
    worst = worst_rel([r["grad_norm"] for r in ours], [w[1] for w in want])
    check(worst <= 1e-4, f"PyTorch: ten steps' gradient norms within 1e-4 (worst {worst:.2e})")
    check(ours[-1]["loss"] < ours[0]["loss"] - 0.05,
          f"the adapters learn: loss {ours[0]['loss']:.4f} -> {ours[-1]['loss']:.4f}")
    return [r["loss"] for r in ours], got


def check_layouts(dump, base, path, reference_losses, one_batch, train):
    """2. Every layout family, and the adapters' dropout across splits."""
    run([dump] + base + ["--set", "parallel.tensor=2", "--output", path("g2.safetensors")],
        ranks=2)
    got2, _ = common.read_safetensors(path("g2.safetensors"))
    worst = max((common.relative_error(got2.get(n, np.zeros(0)), one_batch[n]), n)
                for n in one_batch)
    check(worst[0] <= 1e-5 and sorted(got2) == sorted(one_batch),
          f"M=2: loss and adapter gradients within 1e-5 (worst {worst[0]:.2e}, {worst[1]})")
    for i, (name, overrides, ranks) in enumerate(LAYOUTS):
        train(f"l{i}", overrides, ranks)
        losses = [r["loss"] for r in curve(path(f"l{i}.jsonl"))]
        worst = worst_rel(losses, reference_losses)
        check(worst <= 1e-5, f"{name}: the losses of one process within 1e-5 (worst {worst:.2e})")
    dropout = ["training.lora.dropout=0.1"]
    train("drop1", dropout)
    dropped = [r["loss"] for r in curve(path("drop1.jsonl"))]
    check(worst_rel(dropped, reference_losses) > 1e-4,
          "the adapters' dropout changes the losses")
    for name, overrides in DROPOUT_LAYOUTS:
        train("drop2", dropout + overrides, 2)
        worst = worst_rel([r["loss"] for r in curve(path("drop2.jsonl"))], dropped)
        check(worst <= 1e-5, f"{name} with dropout 0.1: one process's masks (worst {worst:.2e})")


def check_targets(trident, path):
    """3. GPT-2's target names refused for a llama (the default targets: tests/test_config.cpp)."""
    p = run([trident, "train", "--config", path("c.yaml"), "--set",
             f"training.lora={{rank: {RANK}, targets: [qkv, v]}}"], expect_ok=False)
    check(p.returncode != 0 and "qkv is not a linear of the layer (grouped attention" in p.stdout
          and "q, k, v, o, gate, up, down" in p.stdout and "Traceback" not in p.stdout,
          "GPT-2's targets refused for a llama: " + p.stdout.strip()[-200:])


def check_exports(trident, dump, base, path, adapters):
    """4b. Merged and adapters-only exports, read back."""
    run([trident, "export", "--checkpoint", path("ck"), "--merge-lora",
         "--output", path("merged.safetensors")])
    run([trident, "export", "--checkpoint", path("ck"), "--lora-only",
         "--output", path("ad10.safetensors")])
    merged, _ = common.read_safetensors(path("merged.safetensors"))
    base_weights, _ = common.read_safetensors(path("base.safetensors"))
    trained, meta = common.read_safetensors(path("ad10.safetensors"))
    check(sorted(trained) == sorted(adapters) and meta.get("lora_targets") == ",".join(TARGETS),
          f"--lora-only: PEFT's Llama names ({len(trained)} tensors, e.g. {sorted(trained)[0]})")
    worst = (0.0, "")
    for layer in range(SHAPE.layers):
        for target in TARGETS:
            stem = ref.lora_name(layer, target)
            a = trained[PEFT + stem + ".lora_A.weight"].astype(np.float64)
            b = trained[PEFT + stem + ".lora_B.weight"].astype(np.float64)
            want = base_weights["model." + stem + ".weight"] + (ALPHA / RANK) * (b @ a)
            worst = max(worst, (common.relative_error(merged["model." + stem + ".weight"],
                                                      want), stem))
    check(sorted(merged) == sorted(base_weights) and worst[0] <= 1e-6,
          f"--merge-lora: Hugging Face Llama tensors W + (alpha/r)·B·A (worst {worst[0]:.2e}, "
          f"{worst[1]})")
    check_peft_export(check, common, path("ad10.safetensors"), path("base.safetensors"),
                      path("merged.safetensors"), RANK, ALPHA, False)
    check_generate(trident, path)
    run([dump, "--config", path("c.yaml"), "--set", f"model.init_from={path('merged.safetensors')}",
         "--output", path("gm.safetensors")], ranks=1)
    run([dump] + base + ["--set", f"training.lora.init_from={path('ad10.safetensors')}",
                         "--output", path("ga.safetensors")], ranks=1)
    merged_loss = float(common.read_safetensors(path("gm.safetensors"))[0]["loss"][0])
    adapted_loss = float(common.read_safetensors(path("ga.safetensors"))[0]["loss"][0])
    check(abs(merged_loss - adapted_loss) <= 1e-5 * adapted_loss,
          f"the merged export loads to the adapters' loss: {merged_loss:.7f} vs "
          f"{adapted_loss:.7f}")


def check_generate(trident, path):
    """4c. `generate --checkpoint BASE --lora F`: the text of the adapters' own checkpoint.
    BASE holds the base weights as a whole model's checkpoint (one step at lr 1e-30 moves
    no fp32 weight)."""
    run([trident, "train", "--config", path("c.yaml"), "--set", "training.steps=1",
         "--set", "training.lr=1e-30", "--set", "training.min_lr=0",
         "--set", f"checkpoint.dir={path('whole')}", "--set", "checkpoint.interval=1"])
    texts = [run([trident, "generate", "--tokens", "12", "--temperature", "0", "--checkpoint"]
                 + source).stdout
             for source in ([path("ck")], [path("whole"), "--lora", path("ad10.safetensors")],
                            [path("whole")])]
    check(texts[0] == texts[1] != texts[2] and texts[0].strip(),
          "generate: the adapters' checkpoint and the base's with --lora give one text, not "
          f"the base's ({texts})")
    # Bytes: were it not refused, the sampled text need not be UTF-8.
    p = subprocess.run([trident, "generate", "--checkpoint", path("ck"), "--lora",
                        path("ad10.safetensors")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=600)
    said = p.stdout.decode(errors="replace")
    check(p.returncode != 0 and "--lora takes a checkpoint of a whole model" in said,
          "generate --lora over a checkpoint of adapters is refused: " + said.strip()[-160:])


def check_checkpoints(trident, dump, base, path, reference_losses, adapters, train):
    """4. Resume on another layout, exports, changed base weights."""
    train("ck", ["checkpoint.dir=" + path("ck"), "checkpoint.interval=5"])
    shutil.rmtree(path("ck/step_000010"))
    manifest = json.load(open(path("ck/step_000005/manifest.json")))
    check(len(manifest.get("lora", {}).get("base_sha256", "")) == 64,
          f"the manifest records the base weights' SHA-256: {manifest.get('lora')}")
    train("resumed", ["checkpoint.dir=" + path("ck"), "parallel.tensor=2"], ranks=2)
    resumed = [r["loss"] for r in curve(path("resumed.jsonl"))]
    worst = worst_rel(resumed, reference_losses[5:])
    check(worst <= 1e-5, f"resumed on M=2 from one process's step 5: steps 6-10 as "
                         f"uninterrupted (worst {worst:.2e})")
    check_exports(trident, dump, base, path, adapters)
    reweighted, _ = common.read_safetensors(path("base.safetensors"))
    reweighted["model.norm.weight"] += 0.5
    common.write_safetensors(path("base.safetensors"), reweighted)
    p = train("changed", ["checkpoint.dir=" + path("ck"), "training.steps=10"], expect_ok=False)
    check(p.returncode != 0 and "SHA-256" in p.stdout,
          "a resume over changed base weights is refused")


def main():
    trident, dump = binaries_or_skip()
    torch.set_num_threads(1)
    # `generate` decodes with the repository's GPT-2 tokenizer files, wherever the build is.
    os.environ.setdefault("TRIDENT_TOKENIZER_DIR", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "gpt2"))
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        tokens, adapters = write_inputs(path, np.random.default_rng(5))
        lora = (f"training.lora={{rank: {RANK}, alpha: {ALPHA}, targets: [{', '.join(TARGETS)}], "
                f"init_from: {path('adapters.safetensors')}}}")
        base = ["--config", path("c.yaml"), "--set", lora]

        def train(name, overrides=(), ranks=1, expect_ok=True):
            args = [trident, "train"] + base + ["--set", f"logging.metrics={path(name)}.jsonl"]
            for o in overrides:
                args += ["--set", o]
            return run(args, ranks=ranks, expect_ok=expect_ok)

        reference_losses, one_batch = check_reference(dump, base, path, tokens, adapters, train)
        check_layouts(dump, base, path, reference_losses, one_batch, train)
        check_targets(trident, path)
        check_checkpoints(trident, dump, base, path, reference_losses, adapters, train)
    if failures:
        print(f"FAILED {len(failures)} check(s)")
        return 1
    print("all llama LoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
