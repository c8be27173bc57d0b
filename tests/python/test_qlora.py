#!/usr/bin/python3
"""LoRA on a 4-bit NormalFloat base (training.lora.quantize: nf4; model/nf4_base.h) against
PyTorch and across layouts.

1. GPT-2 and llama: ten AdamW steps of the adapters over the nf4 base (blocks of 16, double
   quantization) equal, within 1e-5, a float64 PyTorch LoRA over the base dequantized by the
   numpy reference (nf4_reference.py) on one process; the 4-bit base changes the losses (they
   differ from the 32-bit base's by more than 1e-4), and so does double quantization.
2. Every layout family trains the same adapters over the same dequantized bits: the ten losses
   of M = 2 with sequence parallelism, P = 2 (1F1B, interleaved, ZB-H1, ZB-V), D = 2 (ZeRO-1,
   2 and 3), D = 4 hybrid sharding over 2 (ZeRO-3), C = 2 (ring, Ulysses) and full and
   selective recompute within 1e-5 of one process (GPT-2; llama: M = 2, P = 2, D = 2 ZeRO-1
   and ZeRO-3, C = 2); ZeRO-3 shards and gathers the codes, not dequantized weights. In bf16
   (the tile rounded to bf16): one
   process within 2% of fp32's losses, and M = 2 with sequence parallelism and D = 2 ZeRO-3
   within 2% of one bf16 process (the bound of every 16-bit layout, test_composition.py).
5. The memory the 4-bit base holds: its codes and constants to the format's byte count, and the
   parameters held and planned (check_memory); at ZeRO-3 over D = 2 each rank's half of every
   layer's codes and constants (check_sharded_memory).
3. Checkpoints: a resume on M = 2, and one at ZeRO-3 over D = 2, from one process's step 5
   (the base quantized again at load) give the uninterrupted losses; `checkpoint info` says the base is quantized at
   load; `export --merge-lora` writes the dequantized base plus (alpha/r)·B·A (1e-6), which
   loads as a plain model to the adapted first loss (1e-5).
4. Bad input, one line naming the key, before step 1: quantize without LoRA, a quant_block
   that is not a power of two or does not divide a tensor rank's rows, double_quant: false or
   another quant_block without nf4.

Exit status: 0 passed, 1 a check failed, 77 skipped (no torch, numpy or mpirun).
"""
import json
import math
import os
import re
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
import layout_families  # noqa: E402
import llama_reference  # noqa: E402
import nf4_reference as nf4  # noqa: E402
import test_llama_lora as llama  # noqa: E402
import test_lora as gpt2  # noqa: E402
from lora_training import curve, reference_training, worst_rel  # noqa: E402
from mpi_harness import binaries_or_skip, check, failures, run  # noqa: E402

BLOCK = 16
NF4 = ["training.lora.quantize=nf4", f"training.lora.quant_block={BLOCK}"]
# down's input (the MLP's width) split over M = 2 must hold whole blocks of 16.
llama.SHAPE = llama_reference.LlamaShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4,
                                         kv_heads=2, ffn=64, rope_theta=500000.0, norm_eps=1e-6)
GPT2_FAMILIES = [
    ("M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    ("P=2 1f1b", 2, ["parallel.pipeline=2"]),
    ("P=2 interleaved v=2", 2, ["parallel.pipeline=2", "parallel.schedule=interleaved",
                                "parallel.virtual_stages=2"]),
    ("P=2 zb-h1", 2, ["parallel.pipeline=2", "parallel.schedule=zb-h1"]),
    ("P=2 zb-v", 2, ["parallel.pipeline=2", "parallel.schedule=zb-v"]),
    ("D=2 ZeRO-1", 2, ["parallel.data=2", "parallel.zero_stage=1"]),
    ("D=2 ZeRO-2", 2, ["parallel.data=2", "parallel.zero_stage=2"]),
    ("D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.zero_stage=3"]),
    ("D=4 hybrid shard 2", 4, ["parallel.data=4", "parallel.zero_stage=3",
                               "parallel.data_shard=2", "training.global_batch=8"]),
    ("C=2 ring", 2, ["parallel.context=2"]),
    ("C=2 ulysses", 2, ["parallel.context=2", "parallel.context_mode=ulysses"]),
    ("recompute full", 1, ["training.recompute=full"]),
    ("recompute selective", 1, ["training.recompute=selective"]),
]
# bf16 over the 4-bit base (the tile rounded to bf16) on a tensor and a data split, against one
# bf16 process: within 2% a step, the bound 16-bit layouts are held to (test_composition.py).
BF16_FAMILIES = [
    ("M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"]),
    ("D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.zero_stage=3"]),
]
BF16_TOLERANCE = 0.02
LLAMA_FAMILIES = [
    ("M=2", 2, ["parallel.tensor=2"]),
    ("P=2 1f1b", 2, ["parallel.pipeline=2"]),
    ("D=2 ZeRO-1", 2, ["parallel.data=2", "parallel.zero_stage=1"]),
    ("D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.zero_stage=3"]),
    ("C=2 ring", 2, ["parallel.context=2"]),
]


def dequantize_base(model, conv1d, double_quant=True):
    """Each transformer layer's weight matrix replaced by its NF4 round trip: the matrix as
    output x input features (GPT-2's Conv1D transposed first), as Trident quantizes it."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2 or "lora_" in name or not name.startswith(("h.", "layers.")):
                continue
            w = p.detach().numpy().astype(np.float32)
            w = w.T if conv1d else w
            q = nf4.dequantized(np.ascontiguousarray(w), BLOCK, double_quant)
            p.copy_(torch.from_numpy((q.T if conv1d else q).astype(np.float64)))
    return model


def check_training(label, train, model, parameters, tokens, seq_len, plain):
    """1. Ten steps against PyTorch over the dequantized base; returns one process's losses."""
    train("q1", NF4)
    ours = [r["loss"] for r in curve(train.path("q1.jsonl"))]
    want = reference_training(model, parameters, tokens, gpt2.TRAINING, seq_len)
    worst = worst_rel(ours, [w[0] for w in want])
    check(worst <= 1e-5, f"{label}: ten steps' losses over the nf4 base within 1e-5 of PyTorch "
                         f"over the dequantized base (worst {worst:.2e})")
    train("p1")
    unquantized = [r["loss"] for r in curve(train.path("p1.jsonl"))]
    check(worst_rel(ours, unquantized) > 1e-4,
          f"{label}: the 4-bit base changes the losses ({worst_rel(ours, unquantized):.2e})")
    train("s1", NF4 + ["training.lora.double_quant=false"])
    single = [r["loss"] for r in curve(train.path("s1.jsonl"))]
    check(0 < worst_rel(ours, single), f"{label}: double quantization changes the losses "
                                       f"({worst_rel(ours, single):.2e})")
    return ours


class Trainer:
    def __init__(self, trident, base, path):
        self.trident, self.base, self.path = trident, base, path

    def __call__(self, name, overrides=(), ranks=1, expect_ok=True):
        args = [self.trident, "train"] + self.base + [
            "--set", f"logging.metrics={self.path(name)}.jsonl"]
        for o in overrides:
            args += ["--set", o]
        return run(args, ranks=ranks, expect_ok=expect_ok)


def check_bf16(trident, base, tmp, reference):
    """bf16 compute over the nf4 base: one process within 2% of the fp32 run's losses, and
    each BF16_FAMILIES layout within 2% of that process's."""
    bf16 = base + layout_families.sets(NF4 + ["training.precision=bf16"])
    single = layout_families.one_process(trident, bf16, tmp)
    worst = worst_rel(single, reference) if len(single) == 10 else float("inf")
    check(worst <= BF16_TOLERANCE, f"GPT-2 nf4 bf16, one process: within 2% of fp32's losses "
                                   f"(worst {worst:.2e})")
    for i, (name, ranks, overrides) in enumerate(BF16_FAMILIES):
        metrics = os.path.join(tmp, f"bf16_{i}.jsonl")
        run([trident, "train"] + bf16 + layout_families.sets(
            overrides + [f"logging.metrics={metrics}"]), ranks=ranks)
        got = layout_families.curve(metrics)
        worst = worst_rel(got, single) if len(got) == 10 else float("inf")
        check(worst <= BF16_TOLERANCE, f"GPT-2 nf4 bf16, {name}: within 2% of one bf16 process "
                                       f"(worst {worst:.2e})")


def gpt2_case(trident, tmp):
    path = lambda name: os.path.join(tmp, "gpt2_" + name)  # noqa: E731
    rng = np.random.default_rng(5)
    tokens = np.tile(rng.integers(0, gpt2.SHAPE.vocab, size=80), 5)
    common.write_llmc_shard(path("train.bin"), tokens)
    base_model = common.GPT2Reference(gpt2.SHAPE)
    common.random_init(base_model, 3)
    common.round_to_float32(base_model)
    common.save_hf_weights(base_model, path("base.safetensors"), with_prefix=True)
    adapters = {}
    for layer in range(gpt2.SHAPE.layers):
        for name, fan_in, fan_out in gpt2.TARGETS:
            stem = f"{gpt2.PEFT}h.{layer}.{name}"
            adapters[stem + ".lora_A.weight"] = (
                rng.uniform(-1, 1, (gpt2.RANK, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            adapters[stem + ".lora_B.weight"] = (
                0.02 * rng.standard_normal((fan_out, gpt2.RANK))).astype(np.float32)
    common.write_safetensors(path("adapters.safetensors"), adapters)
    s = gpt2.SHAPE
    common.write_config(path("c.yaml"), {
        "model": {"vocab_size": s.vocab, "seq_len": s.seq_len, "layers": s.layers,
                  "hidden": s.hidden, "heads": s.heads, "ffn_hidden": s.ffn,
                  "init_from": path("base.safetensors")},
        "training": gpt2.TRAINING, "data": {"train": path("train.bin"), "shuffle": False},
        "device": "cpu"})
    lora = (f"training.lora={{rank: {gpt2.RANK}, alpha: {gpt2.ALPHA}, "
            f"init_from: {path('adapters.safetensors')}}}")
    base = ["--config", path("c.yaml"), "--set", lora]
    train = Trainer(trident, base, path)
    model = dequantize_base(gpt2.adapted_reference(3, adapters), conv1d=True)
    reference = check_training("GPT-2", train, model, [p for _, p in gpt2.lora_parameters(model)],
                               tokens, s.seq_len, None)
    layout_families.check_families(trident, base + layout_families.sets(NF4), tmp, "GPT-2 nf4",
                                   reference, GPT2_FAMILIES)
    check_bf16(trident, base, tmp, reference)
    check_checkpoint(trident, train, path, reference)
    check_bad_input(trident, base)


def check_merged(merged, base, adapters):
    """W of each layer matrix: the dequantized base's plus (alpha/r)·B·A (GPT-2's Conv1D
    [in, out]); every other tensor the base's. Returns the worst relative error and its name."""
    worst = (0.0, "")
    for name, w in base.items():
        want = w
        if w.ndim == 2 and ".h." in name:
            stem = gpt2.PEFT + name[len("transformer."):-len(".weight")]
            a, b = adapters[stem + ".lora_A.weight"], adapters[stem + ".lora_B.weight"]
            delta = (gpt2.ALPHA / gpt2.RANK) * (b.astype(np.float64) @ a).T
            want = nf4.dequantized(np.ascontiguousarray(w.T), BLOCK).T + delta
        worst = max(worst, (common.relative_error(merged.get(name, np.zeros(0)), want), name))
    return worst


def check_checkpoint(trident, train, path, reference):
    """Checkpoints keep the adapters and the base's identity; the 4-bit base is quantized again
    at each load: a resume on M = 2 from one process's step 5 gives the uninterrupted losses,
    `checkpoint info` says so, and `export --merge-lora` writes the dequantized base plus B·A,
    which loads (model.init_from, no adapters) to the adapted model's first loss."""
    train("ck", NF4 + ["checkpoint.dir=" + path("ck"), "checkpoint.interval=5"])
    shutil.rmtree(path("ck/step_000010"))
    train("resumed", NF4 + ["checkpoint.dir=" + path("ck"), "parallel.tensor=2"], ranks=2)
    resumed = [r["loss"] for r in curve(path("resumed.jsonl"))]
    worst = worst_rel(resumed, reference[5:])
    check(len(resumed) == 5 and worst <= 1e-5,
          f"nf4 resumed on M=2 from one process's step 5: steps 6-10 as uninterrupted "
          f"(worst {worst:.2e})")
    # And at ZeRO-3 over D = 2 (the codes sharded and gathered), whose checkpoint the export
    # below reads.
    shutil.rmtree(path("ck/step_000010"))
    train("resumed_zero3", NF4 + ["checkpoint.dir=" + path("ck"), "parallel.data=2",
                                  "parallel.zero_stage=3"], ranks=2)
    resumed = [r["loss"] for r in curve(path("resumed_zero3.jsonl"))]
    worst = worst_rel(resumed, reference[5:])
    check(len(resumed) == 5 and worst <= 1e-5,
          f"nf4 resumed at ZeRO-3 over D=2 from one process's step 5: steps 6-10 as "
          f"uninterrupted (worst {worst:.2e})")
    info = run([trident, "checkpoint", "info", path("ck")]).stdout
    check("lora base in 4 bits: nf4, blocks of 16, absmax in 8 bits" in info,
          "checkpoint info: " + next((x for x in info.splitlines() if "4 bits" in x), "none"))
    for kind, name in (("--merge-lora", "merged"), ("--lora-only", "ad10")):
        run([trident, "export", "--checkpoint", path("ck"), kind, "--output",
             path(name + ".safetensors")])
    merged, _ = common.read_safetensors(path("merged.safetensors"))
    adapters, _ = common.read_safetensors(path("ad10.safetensors"))
    base, _ = common.read_safetensors(path("base.safetensors"))
    worst = check_merged(merged, base, adapters)
    check(sorted(merged) == sorted(base) and worst[0] <= 1e-6,
          f"--merge-lora of an nf4 run: the dequantized base + (alpha/r)·B·A (worst "
          f"{worst[0]:.2e}, {worst[1]})")
    one = ["training.steps=1", "checkpoint.dir=null"]
    train("from_merged", one + [f"model.init_from={path('merged.safetensors')}",
                                "training.lora.rank=0", "training.lora.init_from=null"])
    train("from_adapters", one + NF4 + [f"training.lora.init_from={path('ad10.safetensors')}"])
    first = [curve(path(n + ".jsonl"))[0]["loss"] for n in ("from_merged", "from_adapters")]
    check(abs(first[0] - first[1]) <= 1e-5 * first[1],
          f"the merged export loads to the adapted loss: {first[0]:.7f} vs {first[1]:.7f}")


def check_bad_input(trident, base):
    """3. One line naming the key, before step 1."""
    cases = [(["training.lora.rank=0", "training.lora.init_from=null",
               "training.lora.quantize=nf4"],
              "training.lora.quantize: nf4 needs training.lora.rank > 0"),
             (NF4[:1] + ["training.lora.quant_block=48"],
              "training.lora.quant_block: must be a power of two in [16, 4096], got 48"),
             (NF4[:1] + ["training.lora.quant_block=32", "parallel.tensor=2"],
              "training.lora.quant_block (32) must divide the rows each tensor rank holds"),
             (["training.lora.double_quant=false"],
              "training.lora.double_quant: false needs training.lora.quantize: nf4"),
             (["training.lora.quant_block=128"],
              "training.lora.quant_block (128) needs training.lora.quantize: nf4")]
    for overrides, message in cases:
        p = run([trident, "train"] + base + layout_families.sets(overrides), expect_ok=False)
        lines = [line for line in p.stdout.splitlines() if "error" in line]
        check(p.returncode != 0 and len(lines) == 1 and message in lines[0]
              and "step 1" not in p.stdout,
              f"refused in one line: {lines[0] if lines else p.stdout.strip()[-200:]}")


def nf4_bytes(n, double_quant=True):
    """Codes and constants of one matrix of n values in blocks of BLOCK: n/2 bytes of codes,
    and a byte per block, 4 per 256 blocks and the 4-byte mean (or 4 bytes per block)."""
    blocks = n // BLOCK
    if not double_quant:
        return n // 2 + 4 * blocks
    return n // 2 + blocks + 4 * math.ceil(blocks / 256) + 4


def check_memory(train):
    """The resident bytes of a small llama's 4-bit base: the codes and constants its start-up
    line gives equal the format's count (0.5 + 1/B + 4/(256·B) bytes a parameter, plus each
    matrix's mean and last part-filled 256-block), and the parameters the allocator holds
    (mem_params_bytes) trade exactly the quantized matrices' 4 bytes a parameter for those
    codes and constants and the tile they are dequantized into; `trident plan` counts the
    same weights, to the byte."""
    matrices = [llama.linear_shape(t) for t in llama.TARGETS] * llama.SHAPE.layers
    parameters = sum(o * i for o, i in matrices)
    # The tile: the longest run of adjacent matrices (llama's gate, up and down here), fp32.
    tile = 4 * 2 * llama.SHAPE.ffn * llama.SHAPE.hidden + 4 * llama.SHAPE.hidden * llama.SHAPE.ffn
    for double_quant in (True, False):
        name = "mem_dq" if double_quant else "mem_single"
        p = train(name, NF4 + ["training.steps=1",
                               f"training.lora.double_quant={str(double_quant).lower()}"])
        line = re.search(r"4-bit base (\d+) bytes of codes and constants for (\d+) parameters",
                         p.stdout)
        got = (int(line.group(1)), int(line.group(2))) if line else None
        want = (sum(nf4_bytes(o * i, double_quant) for o, i in matrices), parameters)
        check(got == want, f"llama 4-bit base (double_quant {double_quant}): {got} bytes, "
                           f"parameters; the format's count {want}")
        if double_quant:
            quantized = want[0]
    train("mem_plain", ["training.steps=1"])
    held = [curve(train.path(n + ".jsonl"))[0]["mem_params_bytes"] for n in ("mem_plain", "mem_dq")]
    check(held[0] - held[1] == 4 * parameters - quantized - tile,
          f"the parameters held trade the {parameters} quantized parameters' 4 bytes for "
          f"{quantized} bytes of codes and constants and a {tile}-byte tile: "
          f"{held[0]} -> {held[1]} bytes")
    for name, overrides, want in (("32-bit", [], held[0]), ("nf4", NF4, held[1])):
        p = run([train.trident, "plan", "--json"] + train.base + layout_families.sets(overrides))
        planned = json.loads(p.stdout.splitlines()[-1])["stages"][0]["memory_bytes"]["weights"]
        check(planned == want, f"trident plan, {name} base: weights {planned} bytes, the "
                               f"allocated buffers' {want}")
    peak = [curve(train.path(n + ".jsonl"))[0]["mem_peak_bytes"] for n in ("mem_plain", "mem_dq")]
    print(f"allocator peak: 32-bit base {peak[0]} bytes, nf4 base {peak[1]} bytes")
    check_sharded_memory(train, quantized)


def quantized_line(stdout):
    """The start-up line's codes and constants (rank 0's), or None."""
    line = re.search(r"4-bit base (\d+) bytes of codes and constants", stdout)
    return int(line.group(1)) if line else None


def check_sharded_memory(train, whole):
    """ZeRO-3 over D = 2 shards the codes and constants by layers (model/nf4_base.h): each rank
    keeps the half of every layer's bytes (their count padded to even), ~half of one process's
    `whole`, as the start-up line gives them (rank 0's), and `trident plan` counts the weights
    held (mem_params_bytes) to the byte; hybrid sharding (D = 4 over shard groups of 2) keeps
    the same half."""
    layer = sum(nf4_bytes(o * i) for o, i in (llama.linear_shape(t) for t in llama.TARGETS))
    want = llama.SHAPE.layers * ((layer + 1) // 2)
    for name, ranks, grid in (("mem_zero3", 2, ["parallel.data=2"]),
                              ("mem_hybrid", 4, ["parallel.data=4", "parallel.data_shard=2",
                                                 "training.global_batch=8"])):
        overrides = NF4 + grid + ["parallel.zero_stage=3"]
        p = train(name, overrides + ["training.steps=1"], ranks=ranks)
        got = quantized_line(p.stdout)
        check(got == want, f"llama 4-bit base at ZeRO-3, {name}: {got} bytes of codes and "
                           f"constants a rank, the layers' halves {want} (one process: {whole}, "
                           f"ratio {(got or 0) / whole:.4f})")
        held = curve(train.path(name + ".jsonl"))[0]["mem_params_bytes"]
        plan = run([train.trident, "plan", "--json"] + train.base + layout_families.sets(overrides))
        planned = json.loads(plan.stdout.splitlines()[-1])["stages"][0]["memory_bytes"]["weights"]
        check(planned == held, f"trident plan, nf4 at ZeRO-3, {name}: weights {planned} bytes, "
                               f"the allocated buffers' {held}")


def llama_case(trident, tmp):
    path = lambda name: os.path.join(tmp, "llama_" + name)  # noqa: E731
    tokens, adapters = llama.write_inputs(path, np.random.default_rng(5))
    lora = (f"training.lora={{rank: {llama.RANK}, alpha: {llama.ALPHA}, "
            f"targets: [{', '.join(llama.TARGETS)}], init_from: {path('adapters.safetensors')}}}")
    base = ["--config", path("c.yaml"), "--set", lora]
    train = Trainer(trident, base, path)
    model = dequantize_base(llama.adapted_reference(3, adapters), conv1d=False)
    parameters = [p for _, p in llama_reference.lora_parameters(model, llama.TARGETS)]
    reference = check_training("llama", train, model, parameters, tokens, llama.SHAPE.seq_len,
                               None)
    check_memory(train)
    layout_families.check_families(trident, base + layout_families.sets(NF4), tmp, "llama nf4",
                                   reference, LLAMA_FAMILIES)


def main():
    trident, _ = binaries_or_skip()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        gpt2_case(trident, tmp)
        llama_case(trident, tmp)
    if failures:
        print(f"FAILED {len(failures)} check(s)")
        return 1
    print("all QLoRA checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
