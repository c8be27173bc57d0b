#!/usr/bin/python3
"""Low-rank adapters on a mixture of experts' model (training.lora with model.moe): adapters on
the attention's q, k, v and o of a small MoE llama, its router, experts and shared experts
frozen (docs/FEATURES.md, "LoRA"), against moe_reference.py's float64 PyTorch mixture of experts
wrapped by llama_reference.py's adapters, and across layouts.

1. PyTorch: the loss and every adapter gradient of one global batch (two microbatches) within
   1e-5 relative, for a softmax router with a shared expert and the balancing and z losses
   (whose gradients reach the adapters through the frozen router's input) and for a sigmoid
   router on every second layer (the first dense); then 10 AdamW steps of the adapters on the
   loss trained (cross-entropy + the router's losses): the logged loss, moe_aux_loss and
   moe_z_loss within 1e-5, the gradient norms within 1e-4.
2. Layouts: the 10 steps' loss, moe_aux_loss and moe_z_loss of M = 2 with sequence parallelism,
   P = 2 (1F1B, ZB-H1; a layer on each stage), D = 2 with the experts split over E = 2, C = 2
   (ring; with E = 2 too), D = 2 ZeRO-3 with E = 2, C = 2 and D = 2 with hybrid sharding over 2
   at ZeRO-3 with E = 2 (the frozen experts split within each shard group) and full recompute
   within 1e-5 of one process's.
3. Refused at start-up with one line: an MLP target (gate) on the MoE model; the router bias's
   update (bias_update_rate) beside adapters.
4. `export --lora-only` of the trained run writes PEFT's names of the attention adapters alone,
   which PyTorch's reference loads to the loss Trident computes with them
   (training.lora.init_from), within 1e-5; on a mixture Mixtral's format states (no shared
   expert), `export --merge-lora` changes the attention's tensors alone and loads
   (model.init_from) to the adapters' loss, within 1e-5.
5. One process's checkpoint of step 5 resumed at D = 2 with E = 2 gives its steps 6 to 10
   within 1e-5.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch, numpy or mpirun).
"""
import os
import shutil
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
import llama_reference as llama  # noqa: E402
import moe_reference as ref  # noqa: E402
from lora_training import curve, reference_training, worst_rel  # noqa: E402
from mpi_harness import binaries_or_skip, check, failures, run  # noqa: E402

TOLERANCE = 1e-5
SHAPE = llama.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2, ffn=48)
RANK, ALPHA = 4, 8.0
TARGETS = ["q", "k", "v", "o"]
MICRO_BATCH = 2
TRAINING = {"micro_batch": MICRO_BATCH, "global_batch": 4, "steps": 10, "lr": 5e-3,
            "min_lr": 5e-4, "warmup_steps": 2, "decay": "cosine", "weight_decay": 0.1,
            "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.2, "threads": 1}
PEFT = "base_model.model.model."
SOFTMAX = ref.Moe(experts=4, top_k=2, ffn=16, shared=1, aux_loss=0.05, z_loss=0.01)
# Mixtral's format states it (softmax, the top k normalized, experts of ffn_hidden, no shared
# expert): `export --merge-lora` writes it.
MIXTRAL = ref.Moe(experts=4, top_k=2, ffn=SHAPE.ffn, aux_loss=0.05)
SIGMOID = ref.Moe(experts=4, top_k=3, ffn=16, router="sigmoid", normalize=False, scale=2.5,
                  aux_loss=0.02, z_loss=0.01, every=2)
# Each P = 2 stage holds a layer (the automatic cut gives this model's two to the first).
LAYOUTS = [("M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
           ("P=2 1f1b", 2, ["parallel.pipeline=2", "parallel.stage_layers=uniform"]),
           ("P=2 zb-h1", 2, ["parallel.pipeline=2", "parallel.schedule=zb-h1",
                             "parallel.stage_layers=uniform"]),
           ("E=2 D=2", 2, ["parallel.data=2", "parallel.expert=2"]),
           ("C=2 ring", 2, ["parallel.context=2"]),
           ("E=2 C=2 ring", 2, ["parallel.context=2", "parallel.expert=2"]),
           ("E=2 D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.expert=2",
                                  "parallel.zero_stage=3"]),
           ("E=2 C=2 D=2 hybrid shard 2 ZeRO-3", 4, ["parallel.context=2", "parallel.data=2",
                                                     "parallel.expert=2", "parallel.data_shard=2",
                                                     "parallel.zero_stage=3"]),
           ("recompute full", 1, ["training.recompute=full"])]
ROUTER_LOSSES = ("moe_aux_loss", "moe_z_loss")


def sets(overrides):
    return [arg for o in overrides for arg in ("--set", o)]


def write_inputs(path, label, moe, rng):
    """Tokens, the MoE model's base weights (seed 3, the router's bias 0) and adapters of the
    attention's linears with B non-zero; returns the tokens, the adapters and trident's
    arguments."""
    tokens = np.tile(rng.integers(0, SHAPE.vocab, size=80), 5)
    common.write_llmc_shard(path(f"{label}.bin"), tokens)
    base = ref.MoeLlama(SHAPE, moe)
    llama.random_init(base, 3)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.zero_()
    llama.save_hf_weights(base, path(f"{label}_base.safetensors"))
    kv = SHAPE.hidden // SHAPE.heads * SHAPE.kv_heads
    rows = {"q": SHAPE.hidden, "k": kv, "v": kv, "o": SHAPE.hidden}
    adapters = {}
    for layer in range(SHAPE.layers):
        for target in TARGETS:
            stem = PEFT + llama.lora_name(layer, target)
            adapters[stem + ".lora_A.weight"] = (rng.uniform(-1, 1, (RANK, SHAPE.hidden))
                                                 / np.sqrt(SHAPE.hidden)).astype(np.float32)
            adapters[stem + ".lora_B.weight"] = (
                0.02 * rng.standard_normal((rows[target], RANK))).astype(np.float32)
    common.write_safetensors(path(f"{label}_adapters.safetensors"), adapters)
    common.write_config(path(f"{label}.yaml"), {
        "model": {"arch": "llama", "vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len,
                  "layers": SHAPE.layers, "hidden": SHAPE.hidden, "heads": SHAPE.heads,
                  "kv_heads": SHAPE.kv_heads, "ffn_hidden": SHAPE.ffn,
                  "init_from": path(f"{label}_base.safetensors")},
        "training": TRAINING,
        "data": {"train": path(f"{label}.bin"), "valid": None, "shuffle": False},
        "checkpoint": {"dir": None},
        "device": "cpu"})
    lora = (f"training.lora={{rank: {RANK}, alpha: {ALPHA}, targets: [{', '.join(TARGETS)}], "
            f"init_from: {path(f'{label}_adapters.safetensors')}}}")
    return tokens, adapters, ["--config", path(f"{label}.yaml")] + sets(moe.overrides() + [lora])


def adapted_reference(path, label, moe, adapters):
    """The reference mixture of experts from the base weights written, its attention adapted."""
    model = ref.MoeLlama(SHAPE, moe)
    weights, _ = common.read_safetensors(path(f"{label}_base.safetensors"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[llama.hf_name(name)].astype(np.float64)))
    ours = {n[len(PEFT):]: a for n, a in adapters.items()}
    return llama.add_lora(model, ours, TARGETS, ALPHA / RANK)


def check_gradients(dump, path, label, moe, rng):
    """1a. One global batch: the loss and every adapter gradient."""
    tokens, adapters, base = write_inputs(path, label, moe, rng)
    run([dump] + base + ["--output", path(f"{label}_grads.safetensors")])
    got, _ = common.read_safetensors(path(f"{label}_grads.safetensors"))
    model = adapted_reference(path, label, moe, adapters)
    inputs, targets = common.step_batch(tokens, 0, TRAINING["global_batch"], SHAPE.seq_len)
    ce, trained, _, _ = model.losses(inputs, targets, MICRO_BATCH)
    trained.backward()
    check(abs(float(got["loss"][0]) - ce.item()) <= TOLERANCE * ce.item(),
          f"{label}: one batch's loss {float(got['loss'][0]):.7f} vs PyTorch's {ce.item():.7f}")
    factors = llama.lora_parameters(model, TARGETS)
    worst = max((common.relative_error(got.get(n, np.zeros(0)), p.grad.numpy()), n)
                for n, p in factors)
    check(worst[0] <= TOLERANCE and sorted(got) == sorted(["loss"] + [n for n, _ in factors]),
          f"{label}: every adapter gradient ({len(factors)}) within {TOLERANCE} of PyTorch's "
          f"(worst {worst[0]:.2e}, {worst[1]})")
    return tokens, adapters, base


def check_training(trident, path, tokens, adapters, base):
    """1b. Ten AdamW steps of the adapters against PyTorch's. Returns one process's records."""
    run([trident, "train"] + base + sets([f"logging.metrics={path('one.jsonl')}",
                                          f"checkpoint.dir={path('ck')}",
                                          "checkpoint.interval=5"]))
    ours = curve(path("one.jsonl"))
    model = adapted_reference(path, "softmax", SOFTMAX, adapters)
    router = []

    def loss(inputs, targets):
        ce, trained, aux, z = model.losses(inputs, targets, MICRO_BATCH)
        router.append((aux.item(), z.item()))
        return ce, trained

    want = reference_training(model, [p for _, p in llama.lora_parameters(model, TARGETS)],
                              tokens, TRAINING, SHAPE.seq_len, loss)
    worst = worst_rel([r["loss"] for r in ours], [w[0] for w in want])
    check(worst <= TOLERANCE, f"PyTorch: ten steps' losses within {TOLERANCE} (worst {worst:.2e})")
    for i, key in enumerate(ROUTER_LOSSES):
        worst = worst_rel([r[key] for r in ours], [w[i] for w in router])
        check(worst <= TOLERANCE, f"PyTorch: ten steps' {key} within {TOLERANCE} "
                                  f"(worst {worst:.2e})")
    worst = worst_rel([r["grad_norm"] for r in ours], [w[1] for w in want])
    check(worst <= 1e-4, f"PyTorch: ten steps' gradient norms within 1e-4 (worst {worst:.2e})")
    check(ours[-1]["loss"] < ours[0]["loss"] - 0.05,
          f"the adapters learn: loss {ours[0]['loss']:.4f} -> {ours[-1]['loss']:.4f}")
    return ours


def check_layouts(trident, path, base, one):
    """2. Each layout's loss and router losses against one process's."""
    for i, (name, ranks, overrides) in enumerate(LAYOUTS):
        metrics = path(f"layout_{i}.jsonl")
        run([trident, "train"] + base + sets(overrides + [f"logging.metrics={metrics}"]),
            ranks=ranks)
        got = curve(metrics)
        worst = max(worst_rel([r[k] for r in got], [r[k] for r in one])
                    for k in ("loss",) + ROUTER_LOSSES)
        check(worst <= TOLERANCE, f"{name}: ten steps' loss, moe_aux_loss and moe_z_loss within "
                                  f"{TOLERANCE} of one process (worst {worst:.2e})")


def check_resume(trident, path, base, one):
    """5. One process's checkpoint of step 5 resumed at D = 2 with E = 2: its steps 6 to 10."""
    shutil.rmtree(path("ck/step_000010"))
    run([trident, "train"] + base + sets([f"checkpoint.dir={path('ck')}", "parallel.data=2",
                                          "parallel.expert=2",
                                          f"logging.metrics={path('resumed.jsonl')}"]), ranks=2)
    got = curve(path("resumed.jsonl"))
    worst = worst_rel([r["loss"] for r in got], [r["loss"] for r in one[5:]])
    check([r["step"] for r in got] == [6, 7, 8, 9, 10] and worst <= TOLERANCE,
          f"resumed at E=2 D=2 from one process's step 5: steps 6-10 as uninterrupted "
          f"(worst {worst:.2e})")


def check_refusals(trident, base):
    """3. What adapters on a mixture of experts refuse, at start-up."""
    for overrides, said in (
            (["training.lora.targets=[q, gate]"],
             "training.lora.targets: gate with model.moe.experts (4) is not built"),
            (["model.moe.router=sigmoid", "model.moe.bias_update_rate=0.01"],
             "model.moe.bias_update_rate (0.01) with training.lora.rank > 0")):
        p = run([trident, "train"] + base + sets(overrides), expect_ok=False)
        lines = [line for line in p.stdout.splitlines() if line.strip()]
        check(p.returncode != 0 and len(lines) == 1 and said in lines[0] and "step" not in p.stdout,
              f"refused at start-up in one line: {said} ({p.stdout.strip()[-200:]})")


def check_export(trident, dump, path, base):
    """4. The trained adapters (one process's step 10) exported under PEFT's names, read back
    by PyTorch and Trident."""
    run([trident, "export", "--checkpoint", path("ck"), "--lora-only",
         "--output", path("trained.safetensors")])
    trained, meta = common.read_safetensors(path("trained.safetensors"))
    names = sorted(PEFT + llama.lora_name(layer, t) + f".lora_{f}.weight"
                   for layer in range(SHAPE.layers) for t in TARGETS for f in "AB")
    check(sorted(trained) == names and meta.get("lora_targets") == ",".join(TARGETS),
          f"--lora-only: PEFT's names of the attention adapters alone ({len(trained)} tensors, "
          f"targets {meta.get('lora_targets')})")
    run([dump] + base + ["--set", f"training.lora.init_from={path('trained.safetensors')}",
                         "--output", path("reloaded.safetensors")])
    got = float(common.read_safetensors(path("reloaded.safetensors"))[0]["loss"][0])
    model = adapted_reference(path, "softmax", SOFTMAX, trained)
    tokens = common.read_llmc_shard(path("softmax.bin"))
    inputs, targets = common.step_batch(tokens, 0, TRAINING["global_batch"], SHAPE.seq_len)
    with torch.no_grad():
        want = model.losses(inputs, targets, MICRO_BATCH)[0].item()
    check(abs(got - want) <= TOLERANCE * want,
          f"the exported adapters: Trident's loss {got:.7f}, PyTorch's {want:.7f}")


def mixtral_to_qwen(name):
    """A Mixtral tensor's name as the reference writes it (Qwen3-MoE's)."""
    for mixtral, qwen in (("block_sparse_moe", "mlp"), (".w1.", ".gate_proj."),
                          (".w2.", ".down_proj."), (".w3.", ".up_proj.")):
        name = name.replace(mixtral, qwen)
    return name


def check_merged(trident, dump, path, rng):
    """4b. The adapters merged into Mixtral's tensors: the attention's alone change, and the
    merged model's loss is the adapters'."""
    _, _, base = write_inputs(path, "mixtral", MIXTRAL, rng)
    run([trident, "train"] + base + sets(["training.steps=3", f"checkpoint.dir={path('mck')}"]))
    for flag, out in (("--merge-lora", "merged"), ("--lora-only", "mixtral_trained")):
        run([trident, "export", "--checkpoint", path("mck"), flag,
             "--output", path(f"{out}.safetensors")])
    merged, _ = common.read_safetensors(path("merged.safetensors"))
    weights, _ = common.read_safetensors(path("mixtral_base.safetensors"))
    mixtral = any("block_sparse_moe.experts.0.w1" in n for n in merged)
    merged = {mixtral_to_qwen(n): a for n, a in merged.items()}
    changed = sorted(n for n in merged if n in weights and not np.array_equal(merged[n],
                                                                              weights[n]))
    want = sorted(f"model.{llama.lora_name(layer, t)}.weight"
                  for layer in range(SHAPE.layers) for t in TARGETS)
    check(mixtral and sorted(merged) == sorted(weights) and changed == want,
          f"--merge-lora: Mixtral's {len(merged)} tensors, the attention's {len(changed)} changed")
    run([dump, "--config", path("mixtral.yaml")] + sets(
        MIXTRAL.overrides() + [f"model.init_from={path('merged.safetensors')}"]) +
        ["--output", path("merged_loss.safetensors")])
    run([dump] + base + ["--set", f"training.lora.init_from={path('mixtral_trained.safetensors')}",
                         "--output", path("adapted_loss.safetensors")])
    got, want = (float(common.read_safetensors(path(f"{f}_loss.safetensors"))[0]["loss"][0])
                 for f in ("merged", "adapted"))
    check(abs(got - want) <= TOLERANCE * want,
          f"the merged export loads to the adapters' loss: {got:.7f} vs {want:.7f}")


def main():
    trident, dump = binaries_or_skip()
    torch.set_num_threads(1)
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        check_gradients(dump, path, "sigmoid", SIGMOID, rng)
        tokens, adapters, base = check_gradients(dump, path, "softmax", SOFTMAX, rng)
        one = check_training(trident, path, tokens, adapters, base)
        check_layouts(trident, path, base, one)
        check_refusals(trident, base)
        check_export(trident, dump, path, base)
        check_merged(trident, dump, path, rng)
        check_resume(trident, path, base, one)
    if failures:
        print(f"FAILED {len(failures)} check(s)")
        return 1
    print("all MoE LoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
