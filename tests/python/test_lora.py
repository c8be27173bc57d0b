#!/usr/bin/python3
"""Low-rank adapters (training.lora) against PyTorch and across layouts.

1. A float64 PyTorch LoRA over the reference GPT-2 (gpt2_reference.py), from the same base
   weights and the same adapters file (B non-zero): the loss and every adapter gradient of one
   global batch within 1e-5, and ten AdamW steps' losses within 1e-5 (grad norm 1e-4).
2. Every layout trains the same adapters: the losses of M = 2 (with and without sequence
   parallelism), P = 2 (1F1B and ZB-H1), D = 2, C = 2 (ring attention), 2 x 2 x 2 with full
   recompute equal 1 x 1 x 1
   within 1e-5, and the adapters' gradients of one batch under M = 2 too; under M = 2 the
   tensor group moves what the model's layers move plus the whole factors' gradients once.
3. With B = 0 (the default start) the first loss is the base model's, to the printed digit.
4. Checkpoints hold the adapters and the base's SHA-256: a resume of step 5 on another layout
   gives the uninterrupted run's losses; `export --merge-lora` loads (model.init_from) to the adapted model's loss;
   `export --lora-only` (with PEFT's adapter_config.json, whose merge by PEFT's rules is
   `--merge-lora`'s) and `generate --weights --lora` give the checkpoint's text; changed
   base weights and other adapters are refused with a message.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch, numpy or mpirun).
"""
import json
import shutil
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: needs Debian's python3-torch ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402
from lora_training import curve, reference_training, worst_rel  # noqa: E402
from mpi_harness import binaries_or_skip, check, failures, run  # noqa: E402
from peft_check import check_peft_export  # noqa: E402

SHAPE = ref.GPTShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, ffn=128)
RANK, ALPHA = 4, 8.0
TRAINING = {"micro_batch": 2, "global_batch": 4, "steps": 10, "lr": 5e-3, "min_lr": 5e-4,
            "warmup_steps": 2, "decay": "cosine", "weight_decay": 0.1, "beta1": 0.9,
            "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.2, "threads": 1}
PEFT = "base_model.model.transformer."
# The adapted linears: (module path, in, out), as PEFT names them.
TARGETS = [("attn.c_attn", SHAPE.hidden, 3 * SHAPE.hidden),
           ("attn.c_proj", SHAPE.hidden, SHAPE.hidden),
           ("mlp.c_fc", SHAPE.hidden, SHAPE.ffn),
           ("mlp.c_proj", SHAPE.ffn, SHAPE.hidden)]


class LoraConv1D(torch.nn.Module):
    """W + (alpha / r)·B·A beside a frozen Conv1D: y = x W + b + s·(x Aᵀ) Bᵀ."""

    def __init__(self, base, a, b):
        super().__init__()
        self.base = base
        self.lora_A = torch.nn.Parameter(torch.tensor(a, dtype=torch.float64))
        self.lora_B = torch.nn.Parameter(torch.tensor(b, dtype=torch.float64))

    def forward(self, x):
        return self.base(x) + (ALPHA / RANK) * (x @ self.lora_A.t()) @ self.lora_B.t()


def adapted_reference(base_seed, adapters):
    model = ref.GPT2Reference(SHAPE)
    ref.random_init(model, base_seed)
    ref.round_to_float32(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for layer, block in enumerate(model.h):
        for path, _, _ in TARGETS:
            parent, leaf = path.split(".")
            owner = getattr(block, parent)
            name = f"{PEFT}h.{layer}.{path}"
            setattr(owner, leaf, LoraConv1D(getattr(owner, leaf), adapters[name + ".lora_A.weight"],
                                            adapters[name + ".lora_B.weight"]))
    return model


def lora_parameters(model):
    """(trident name, parameter) of every adapter."""
    out = []
    for layer, block in enumerate(model.h):
        for path, _, _ in TARGETS:
            parent, leaf = path.split(".")
            m = getattr(getattr(block, parent), leaf)
            out += [(f"h.{layer}.{path}.lora_A.weight", m.lora_A),
                    (f"h.{layer}.{path}.lora_B.weight", m.lora_B)]
    return out


def main():
    trident, dump = binaries_or_skip()
    torch.set_num_threads(1)
    # `generate` decodes with the repository's GPT-2 tokenizer files, wherever the build is.
    os.environ.setdefault("TRIDENT_TOKENIZER_DIR", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "gpt2"))
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        rng = np.random.default_rng(5)
        # Two repeated stretches of tokens, so that the adapters have something to learn.
        tokens = np.tile(rng.integers(0, SHAPE.vocab, size=80), 5)
        ref.write_llmc_shard(path("train.bin"), tokens)
        base_model = ref.GPT2Reference(SHAPE)
        ref.random_init(base_model, 3)
        ref.round_to_float32(base_model)
        ref.save_hf_weights(base_model, path("base.safetensors"), with_prefix=True)
        adapters = {}
        for layer in range(SHAPE.layers):
            for name, fan_in, fan_out in TARGETS:
                stem = f"{PEFT}h.{layer}.{name}"
                adapters[stem + ".lora_A.weight"] = (
                    rng.uniform(-1, 1, (RANK, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
                adapters[stem + ".lora_B.weight"] = (
                    0.02 * rng.standard_normal((fan_out, RANK))).astype(np.float32)
        ref.write_safetensors(path("adapters.safetensors"), adapters)
        ref.write_config(path("c.yaml"), {
            "model": {"vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len, "layers": SHAPE.layers,
                      "hidden": SHAPE.hidden, "heads": SHAPE.heads, "ffn_hidden": SHAPE.ffn,
                      "init_from": path("base.safetensors")},
            "training": TRAINING,
            "data": {"train": path("train.bin"), "shuffle": False},
            "device": "cpu"})
        lora = f"training.lora={{rank: {RANK}, alpha: {ALPHA}, init_from: {path('adapters.safetensors')}}}"
        base = ["--config", path("c.yaml"), "--set", lora]

        def train(name, overrides=(), ranks=1, expect_ok=True):
            args = [trident, "train"] + base + ["--set", f"logging.metrics={path(name)}.jsonl"]
            for o in overrides:
                args += ["--set", o]
            return run(args, ranks=ranks, expect_ok=expect_ok)

        # 1. PyTorch: one batch's loss and adapter gradients, then ten steps.
        run([dump] + base + ["--output", path("g1.safetensors")], ranks=1)
        got, _ = ref.read_safetensors(path("g1.safetensors"))
        model = adapted_reference(3, adapters)
        inputs, targets = ref.step_batch(tokens, 0, TRAINING["global_batch"], SHAPE.seq_len)
        loss = model.loss(inputs, targets)
        loss.backward()
        check(abs(float(got["loss"][0]) - loss.item()) <= 1e-5 * loss.item(),
              f"PyTorch: one batch's loss {float(got['loss'][0]):.7f} vs {loss.item():.7f}")
        worst = max((ref.relative_error(got[n], p.grad.numpy()), n)
                    for n, p in lora_parameters(model))
        check(worst[0] <= 1e-5 and len(got) == 1 + 2 * 4 * SHAPE.layers,
              f"PyTorch: every adapter gradient within 1e-5 (worst {worst[0]:.2e}, {worst[1]})")

        train("m1")
        ours = curve(path("m1.jsonl"))
        trained = adapted_reference(3, adapters)
        want = reference_training(trained, [p for _, p in lora_parameters(trained)], tokens,
                                  TRAINING, SHAPE.seq_len)
        check(worst_rel([r["loss"] for r in ours], [w[0] for w in want]) <= 1e-5,
              f"PyTorch: ten steps' losses within 1e-5 (worst "
              f"{worst_rel([r['loss'] for r in ours], [w[0] for w in want]):.2e})")
        check(worst_rel([r["grad_norm"] for r in ours], [w[1] for w in want]) <= 1e-4,
              "PyTorch: ten steps' gradient norms within 1e-4")
        clipped = [w[1] > TRAINING["grad_clip"] for w in want]
        check(any(clipped) and not all(clipped),
              f"clipping on some steps only: {[round(w[1], 4) for w in want]}")
        check(ours[-1]["loss"] < ours[0]["loss"] - 0.05,
              f"the adapters learn: loss {ours[0]['loss']:.4f} -> {ours[-1]['loss']:.4f}")
        reference_losses = [r["loss"] for r in ours]

        # 2. Layouts.
        run([dump] + base + ["--set", "parallel.tensor=2", "--output", path("g2.safetensors")],
            ranks=2)
        got2, _ = ref.read_safetensors(path("g2.safetensors"))
        worst = max((ref.relative_error(got2[n], got[n]), n) for n in got)
        check(worst[0] <= 1e-5, f"M=2: loss and adapter gradients within 1e-5 (worst {worst[0]:.2e}, {worst[1]})")
        layouts = [("M=2", ["parallel.tensor=2"], 2),
                   ("M=2 +SP", ["parallel.tensor=2", "parallel.sequence_parallel=true"], 2),
                   ("P=2 1f1b", ["parallel.pipeline=2"], 2),
                   ("P=2 zb-h1", ["parallel.pipeline=2", "parallel.schedule=zb-h1"], 2),
                   ("D=2", ["parallel.data=2"], 2),
                   ("C=2 ring", ["parallel.context=2"], 2),
                   ("2x2x2 full recompute", ["parallel.pipeline=2", "parallel.tensor=2",
                                             "parallel.data=2", "training.recompute=full"], 8)]
        for i, (name, overrides, ranks) in enumerate(layouts):
            train(f"l{i}", overrides, ranks)
            losses = [r["loss"] for r in curve(path(f"l{i}.jsonl"))]
            check(len(losses) == 10 and worst_rel(losses, reference_losses) <= 1e-5,
                  f"{name}: the losses of 1x1x1 within 1e-5 (worst {worst_rel(losses, reference_losses):.2e})")

        # The adapters add no collective to the forward, nor per microbatch: the tensor
        # group's traffic is the layer's own, plus one all-reduce per step of the whole
        # factors' gradients (partial sums on each rank: A of qkv and fc, B of the c_proj's),
        # r·C values each.
        run([trident, "train", "--config", path("c.yaml"), "--set", "parallel.tensor=2",
             "--set", f"logging.metrics={path('whole2.jsonl')}"], ranks=2)
        whole_bytes = {r["tp_all_reduce_bytes"] for r in curve(path("whole2.jsonl"))}
        lora_bytes = {r["tp_all_reduce_bytes"] for r in curve(path("l0.jsonl"))}
        extra = 4 * SHAPE.layers * 4 * RANK * SHAPE.hidden
        check(len(whole_bytes) == 1 and lora_bytes == {b + extra for b in whole_bytes},
              f"M=2: tensor all-reduce bytes per step {lora_bytes} = the model's {whole_bytes} "
              f"+ the factors' gradients {extra}")

        # 3. B = 0: the base model's loss.
        plain = [trident, "train", "--config", path("c.yaml"), "--set", "training.steps=1"]
        run(plain + ["--set", f"logging.metrics={path('base.jsonl')}"])
        run(plain + ["--set", f"training.lora={{rank: {RANK}}}",
                     "--set", f"logging.metrics={path('b0.jsonl')}"])
        with open(path("base.jsonl")) as f0, open(path("b0.jsonl")) as f1:
            first = [json.loads(f.readline())["loss"] for f in (f0, f1)]
        check(first[0] == first[1], f"B = 0: the first loss is the base model's ({first[1]} vs {first[0]})")

        # 4. Checkpoints: written at step 5 on 1x1x1, resumed on 2x1x2.
        train("ck", ["checkpoint.dir=" + path("ck"), "checkpoint.interval=5"])
        shutil.rmtree(path("ck/step_000010"))
        manifest = json.load(open(path("ck/step_000005/manifest.json")))
        # Relative to the checkpoint, so that the runs can move together.
        recorded = manifest.get("lora", {}).get("base", "")
        check(os.path.normpath(os.path.join(path("ck/step_000005"), recorded))
              == path("base.safetensors") and not os.path.isabs(recorded)
              and len(manifest["lora"].get("base_sha256", "")) == 64,
              f"the manifest points at the base weights, relative to itself: {manifest.get('lora')}")
        train("resumed", ["checkpoint.dir=" + path("ck"), "parallel.pipeline=2",
                          "parallel.data=2"], ranks=4)
        resumed = [r["loss"] for r in curve(path("resumed.jsonl"))]
        check(len(resumed) == 5 and worst_rel(resumed, reference_losses[5:]) <= 1e-5,
              "resumed on 2x1x2 from 1x1x1's step 5: steps 6-10 as uninterrupted")

        run([trident, "export", "--checkpoint", path("ck"), "--merge-lora",
             "--output", path("merged.safetensors")])
        run([trident, "export", "--checkpoint", path("ck"), "--lora-only",
             "--output", path("ad10.safetensors")])
        check_peft_export(check, ref, path("ad10.safetensors"), path("base.safetensors"),
                          path("merged.safetensors"), RANK, ALPHA, True)
        run([dump, "--config", path("c.yaml"), "--set", f"model.init_from={path('merged.safetensors')}",
             "--output", path("gm.safetensors")], ranks=1)
        run([dump] + base + ["--set", f"training.lora.init_from={path('ad10.safetensors')}",
                             "--output", path("ga.safetensors")], ranks=1)
        merged_loss = float(ref.read_safetensors(path("gm.safetensors"))[0]["loss"][0])
        adapted_loss = float(ref.read_safetensors(path("ga.safetensors"))[0]["loss"][0])
        check(abs(merged_loss - adapted_loss) <= 1e-5 * adapted_loss and adapted_loss < first[0],
              f"the merged export loads to the adapted loss: {merged_loss:.7f} vs {adapted_loss:.7f}")
        texts = [run([trident, "generate", "--tokens", "12", "--temperature", "0",
                      "--head-dim", str(SHAPE.hidden // SHAPE.heads)] + source).stdout
                 for source in (["--checkpoint", path("ck")],
                                ["--weights", path("merged.safetensors")],
                                ["--weights", path("base.safetensors"), "--lora", path("ad10.safetensors")])]
        check(texts[0] == texts[1] == texts[2] and texts[0].strip(),
              "generate: the checkpoint, the merged weights and base + adapters give one text")

        # Refusals: a whole-model export, other adapters, changed base weights.
        p = run([trident, "export", "--checkpoint", path("ck"), "--output", path("x.safetensors")],
                expect_ok=False)
        check(p.returncode != 0 and "--merge-lora" in p.stdout, "export without a flag: " + p.stdout.strip())
        p = train("rank8", ["checkpoint.dir=" + path("ck"), "training.lora.rank=8",
                            "training.lora.init_from=null"], expect_ok=False)
        check(p.returncode != 0 and "training.lora" in p.stdout and "rank 4" in p.stdout,
              "a resume with other adapters is refused")
        reweighted, _ = ref.read_safetensors(path("base.safetensors"))
        reweighted["transformer.ln_f.bias"] += 0.5
        ref.write_safetensors(path("base.safetensors"), reweighted)
        p = train("changed", ["checkpoint.dir=" + path("ck"), "training.steps=10"], expect_ok=False)
        check(p.returncode != 0 and "SHA-256" in p.stdout, "a resume over changed base weights is refused")
        p = run([trident, "export", "--checkpoint", path("ck"), "--merge-lora",
                 "--output", path("y.safetensors")], expect_ok=False)
        check(p.returncode != 0 and "SHA-256" in p.stdout, "an export over changed base weights is refused")

    if failures:
        print(f"FAILED {len(failures)} check(s)")
        return 1
    print("all LoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
