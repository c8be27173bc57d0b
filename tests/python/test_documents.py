#!/usr/bin/python3
"""Packed documents (data.documents: mask, data.eod_token, data.mask_eod_loss,
training.loss_normalization: tokens; docs/ARCHITECTURE.md "Packed documents"):

0. the PyTorch reference's masks and positions (documents_reference.py) against each document
   run alone through the plain reference models, GPT-2's and a llama's (1e-10);
1. five AdamW steps of `trident train` against the reference, GPT-2 and a llama with grouped
   attention: loss 1e-5 relative, grad_norm 1e-4, with documents shorter than a window, exactly
   a window, crossing the middle of a window, and longer than a window;
   each step's documents_per_window, and the validation loss after the last step;
2. `stream` (the default) is today's: the default config's losses equal those main recorded,
   bit for bit, and so does the run that names every new key at its default;
   A global batch of eod inputs only counts no loss and no gradient, said once; data without eod
   is warned of;
3. the layout families within 1e-5 of one process: GPT-2 on every family of
   layout_families.py (tensor with and without sequence parallelism and tp_overlap; every
   pipeline schedule, ZB-H2 and ZB-V included; ZeRO 0-3 and hybrid sharding; ring and Ulysses
   context parallelism with documents crossing the context chunks, and ring with M = 2; full
   and selective recompute) and a smaller micro-batch; a llama on six of them; the same in
   bf16 against one bf16 process on the families whose split keeps one process's arithmetic
   (every pipeline schedule, ZeRO 0-3 and hybrid sharding, recompute, Ulysses; a llama on three);
4. low-rank adapters over a base trained on documents on four families (M = 2 with sequence
   parallelism, ZB-H1, ZeRO-1, ring), and the same run in bf16 within 2% of fp32.

Exit 77 (skipped) without torch and numpy or mpirun.
"""
import os
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e})")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import documents_reference as docs  # noqa: E402
import gpt2_reference as gpt2  # noqa: E402
import llama_reference as llama  # noqa: E402
from layout_families import FAMILIES as ALL_FAMILIES  # noqa: E402
from layout_families import check_families, curve, sets  # noqa: E402
from mpi_harness import (binaries_or_skip, check, failures, losses, run,  # noqa: E402
                         tiny_run, write_shard)

SEQ, GLOBAL_BATCH, STEPS = 16, 4, 5
GPT2_SHAPE = gpt2.GPTShape(vocab=100, seq_len=SEQ, layers=2, hidden=32, heads=4, ffn=64)
LLAMA_SHAPE = llama.LlamaShape(vocab=100, seq_len=SEQ, layers=2, hidden=32, heads=4, kv_heads=2,
                               ffn=48, rope_theta=10000.0, norm_eps=1e-6)
TRAINING = {"steps": STEPS, "lr": 5.0e-3, "min_lr": 5.0e-4, "warmup_steps": 2,
            "decay": "cosine", "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8,
            "grad_clip": 1.0, "seed": 7, "micro_batch": 2, "global_batch": GLOBAL_BATCH,
            "threads": 1, "loss_normalization": "tokens"}
DOCUMENTS = ["data.documents=mask", "data.mask_eod_loss=true",
             "training.loss_normalization=tokens"]
# The default config's 10 losses (tests/python/mpi_harness.py tiny_run) as main wrote them.
MAIN_LOSSES = [5.72166276, 5.71710873, 5.69912362, 5.72744703, 5.72369909, 5.71867275,
               5.71772695, 5.71696091, 5.72577286, 5.74337959]


def document_tokens(count, vocab, eod, seed):
    """Tokens below eod, with eods ending: three short documents in window 0 (ends at 4, 7, 15),
    one exactly window 1 (31), one crossing from window 2 into 3 (ends 40, then 54), one longer
    than a window (54 to 90), then documents of random lengths."""
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, eod, size=count)]
    ends = [4, 7, 15, 31, 40, 54, 90]
    at = 90
    while at < count:
        at += int(rng.integers(1, 12))
        ends.append(at)
    for e in ends:
        if e < count:
            tokens[e] = eod
    return tokens


def check_reference():
    """The masks against a loop over the documents of each window."""
    torch.manual_seed(0)
    eod = 99
    inputs = torch.tensor(document_tokens(4 * SEQ, 100, eod, 3)).reshape(4, SEQ)
    for name, model in (("gpt2", gpt2.GPT2Reference(GPT2_SHAPE)),
                        ("llama", llama.LlamaReference(LLAMA_SHAPE))):
        (gpt2 if name == "gpt2" else llama).random_init(model, 5)
        with torch.no_grad():
            masked = docs.logits(model, inputs, eod)
            alone = docs.per_document_logits(model, inputs, eod)
            causal = model.logits(inputs)
        error = float((masked - alone).abs().max())
        moved = float((masked - causal).abs().max())
        check(error <= 1e-10 and moved > 1e-3,
              f"reference {name}: masked logits equal each document run alone "
              f"(max abs {error:.1e}; {moved:.1e} from one causal window)")


def config(tmp, name, shape, weights, shard, metrics):
    model = {"vocab_size": shape.vocab, "seq_len": SEQ, "layers": shape.layers,
             "hidden": shape.hidden, "heads": shape.heads, "ffn_hidden": shape.ffn,
             "init_from": weights}
    if name == "llama":
        model.update(arch="llama", kv_heads=shape.kv_heads, rope_theta=shape.rope_theta,
                     norm_eps=shape.norm_eps)
    else:
        model.update(dropout=0.0)
    path = os.path.join(tmp, f"{name}.yaml")
    gpt2.write_config(path, {
        "model": model, "training": TRAINING,
        "data": {"train": shard, "valid": shard, "shuffle": False, "documents": "mask",
                 "eod_token": shape.vocab - 1, "mask_eod_loss": True},
        "logging": {"interval": 1, "metrics": metrics}, "checkpoint": {"dir": None},
        "device": "cpu"})
    return path


def check_training(trident, tmp, name):
    shape = GPT2_SHAPE if name == "gpt2" else LLAMA_SHAPE
    lib = gpt2 if name == "gpt2" else llama
    model = gpt2.GPT2Reference(shape) if name == "gpt2" else llama.LlamaReference(shape)
    lib.random_init(model, 21)
    gpt2.round_to_float32(model)
    eod = shape.vocab - 1
    tokens = np.array(document_tokens(GLOBAL_BATCH * SEQ * STEPS + 1, shape.vocab, eod, 22))
    weights, shard = os.path.join(tmp, f"{name}.safetensors"), os.path.join(tmp, f"{name}.bin")
    metrics = os.path.join(tmp, f"{name}.jsonl")
    if name == "gpt2":
        gpt2.save_hf_weights(model, weights, with_prefix=False)
    else:
        llama.save_hf_weights(model, weights)
    gpt2.write_llmc_shard(shard, tokens)
    run([trident, "train", "--config", config(tmp, name, shape, weights, shard, metrics)])
    records = losses(metrics)
    t = TRAINING
    optimizer = lib.make_adamw(model, t["lr"], t["beta1"], t["beta2"], t["eps"],
                               t["weight_decay"])
    worst_loss = worst_norm = 0.0
    documents = []
    for step, record in enumerate(records):
        for group in optimizer.param_groups:
            group["lr"] = gpt2.lr_at(step, t["lr"], t["min_lr"], t["warmup_steps"], STEPS,
                                     t["decay"])
        inputs, targets = gpt2.step_batch(tokens, step, GLOBAL_BATCH, SEQ)
        starts = (inputs[:, :-1] == eod).sum().item() + GLOBAL_BATCH
        documents.append(record.get("documents_per_window") == starts / GLOBAL_BATCH)
        optimizer.zero_grad(set_to_none=True)
        loss = docs.loss(model, inputs, targets, eod, mask_eod_loss=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"]).item()
        optimizer.step()
        worst_loss = max(worst_loss, abs(record["loss"] - loss.item()) / abs(loss.item()))
        worst_norm = max(worst_norm, abs(record["grad_norm"] - norm) / norm)
    check(len(records) == STEPS and worst_loss <= 1e-5 and worst_norm <= 1e-4,
          f"{name}: {len(records)} steps against the reference: loss within 1e-5 (worst "
          f"{worst_loss:.2e}), grad_norm within 1e-4 (worst {worst_norm:.2e})")
    check(len(documents) == STEPS and all(documents),
          f"{name}: each step's documents_per_window is its windows' mean count")
    # Validation after the last step: samples 0 .. global_batch - 1, the same masking.
    with torch.no_grad():
        inputs, targets = gpt2.step_batch(tokens, 0, GLOBAL_BATCH, SEQ)
        want = docs.loss(model, inputs, targets, eod, mask_eod_loss=True).item()
    got = records[-1].get("val_loss") if records else None
    check(got is not None and abs(got - want) / want <= 1e-5,
          f"{name}: the validation loss after the last step {got} within 1e-5 of the "
          f"reference's {want:.8f}")


def check_nothing_counted(trident, tmp):
    """A global batch of eod inputs only counts nothing: loss 0, gradient 0, said once."""
    directory = os.path.join(tmp, "eod_only")
    os.makedirs(directory)
    base = tiny_run(directory, ["data.mask_eod_loss=true", "data.eod_token=299"])
    write_shard(os.path.join(directory, "train.bin"), [299] * 3000)
    metrics = os.path.join(directory, "m.jsonl")
    out = run([trident, "train"] + base + sets([f"logging.metrics={metrics}"])).stdout
    said = out.count("no position of the global batch counts a loss")
    check(said == 1 and curve(metrics) == [0.0] * 10,
          f"eod inputs only: 10 losses of 0 ({curve(metrics)[:2]}...), said {said} time(s)")
    norms = [r["grad_norm"] for r in losses(metrics) if "loss" in r]
    check(norms == [0.0] * 10,
          f"eod inputs only: no gradient, 10 gradient norms of 0 ({norms[:2]}...)")
    # No eod at all under the mask: a warning naming the token and the file, and the run goes on.
    data = os.path.join(directory, "no_eod.bin")
    write_shard(data, [i % 299 for i in range(3000)])
    out = run([trident, "train"] + base + sets(["data.documents=mask", f"data.train={data}",
                                                "training.steps=1"])).stdout
    check(f"warning: data.documents: mask, but data.eod_token 299 is not among the first 3000 "
          f"tokens of llm.c shard {data}" in out, "a mask over data without eod tokens is warned of")


def check_stream(trident, tmp):
    base = tiny_run(tmp)
    got = []
    for i, extra in enumerate(([], ["data.documents=stream", "data.eod_token=299",
                                    "data.mask_eod_loss=false",
                                    "training.loss_normalization=microbatch"])):
        metrics = os.path.join(tmp, f"stream_{i}.jsonl")
        run([trident, "train"] + base + sets(extra + [f"logging.metrics={metrics}"]))
        got.append(curve(metrics))
    check(got[0] == MAIN_LOSSES and got[1] == MAIN_LOSSES,
          f"stream: the default's 10 losses and those with every key named equal main's, bit "
          f"for bit ({got[0][:2]}..., {got[1][:2]}... vs {MAIN_LOSSES[:2]}...)")


INTERLEAVED = ("P=2 interleaved v=2", 2, ["parallel.pipeline=2", "parallel.schedule=interleaved",
                                          "parallel.virtual_stages=2"])
TENSOR = ("M=2 +SP", 2, ["parallel.tensor=2", "parallel.sequence_parallel=true"])
ZERO3 = ("D=2 ZeRO-3", 2, ["parallel.data=2", "parallel.zero_stage=3"])
SMALLER = ("micro_batch 1", 1, ["training.micro_batch=1"])
ULYSSES = ("C=2 ulysses", 2, ["parallel.context=2", "parallel.context_mode=ulysses"])
RING = ("C=2 ring", 2, ["parallel.context=2"])
# Every family (layout_families.py) on GPT-2, and a smaller microbatch; a llama's rotary
# positions on the ones that move rows between ranks or stages. Interleaving gives a stage
# chunks that neither embed nor hold the head.
FAMILIES = {
    "gpt2": ALL_FAMILIES + [SMALLER],
    "llama": [INTERLEAVED, TENSOR, ZERO3, SMALLER, ULYSSES, RING],
}


def check_layouts(trident, tmp):
    for arch in ("gpt2", "llama"):
        directory = os.path.join(tmp, arch)
        os.makedirs(directory)
        extra = ["model.arch=llama", "model.kv_heads=2"] if arch == "llama" else []
        base = tiny_run(directory, DOCUMENTS + extra + ["data.eod_token=299"])
        write_shard(os.path.join(directory, "train.bin"), document_tokens(3000, 300, 299, 4))
        check_families(trident, base, directory, f"documents {arch}", families=FAMILIES[arch])


# bf16 against one bf16 process on the families whose split computes every stored value with
# one process's products in one process's order (pipeline stages, data-parallel replicas and
# shards, recompute, Ulysses' whole heads). A tensor split sums its ranks' partial products, ring
# attention its key/value blocks' partial outputs, a smaller micro-batch runs other GEMM shapes:
# another fp32 order, which in bf16 flips the rounding of some stored values by one bf16 step and
# moves the losses by 1.6e-5 to 8e-5, with or without documents (docs/ARCHITECTURE.md "Packed
# documents"); those families are held in fp32 above.
BF16_FAMILIES = {
    "gpt2": [f for f in ALL_FAMILIES if f[0].startswith(("P=2", "D=", "recompute"))]
    + [ULYSSES],
    "llama": [INTERLEAVED, ZERO3, ULYSSES],
}


def check_bf16_layouts(trident, tmp):
    for arch in ("gpt2", "llama"):
        directory = os.path.join(tmp, f"{arch}_bf16")
        os.makedirs(directory)
        extra = ["model.arch=llama", "model.kv_heads=2"] if arch == "llama" else []
        base = tiny_run(directory, DOCUMENTS + extra + ["data.eod_token=299",
                                                        "training.precision=bf16"])
        write_shard(os.path.join(directory, "train.bin"), document_tokens(3000, 300, 299, 4))
        check_families(trident, base, directory, f"documents {arch} bf16",
                       families=BF16_FAMILIES[arch])


LORA_FAMILIES = [TENSOR, ("P=2 zb-h1", 2, ["parallel.pipeline=2", "parallel.schedule=zb-h1"]),
                 ("D=2 ZeRO-1", 2, ["parallel.data=2", "parallel.zero_stage=1"]), RING]


def check_lora_and_bf16(trident, tmp):
    """Adapters over a base trained on documents, on four families; bf16 within 2% of fp32."""
    directory = os.path.join(tmp, "lora")
    os.makedirs(directory)
    base = tiny_run(directory, DOCUMENTS + ["data.eod_token=299"])
    write_shard(os.path.join(directory, "train.bin"), document_tokens(3000, 300, 299, 4))
    ck = os.path.join(directory, "ck")
    run([trident, "train"] + base + sets([f"checkpoint.dir={ck}", "training.steps=2"]))
    lora = base + sets([f"model.init_from={ck}/step_000002", "training.lora.rank=4"])
    check_families(trident, lora, directory, "documents with LoRA", families=LORA_FAMILIES)
    fp32 = curve(os.path.join(directory, "families_reference.jsonl"))
    metrics = os.path.join(directory, "bf16.jsonl")
    run([trident, "train"] + lora + sets(["training.precision=bf16",
                                          f"logging.metrics={metrics}"]))
    got = curve(metrics)
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, fp32)) if len(got) == 10 else 1.0
    check(worst <= 0.02, f"documents with LoRA in bf16: 10 losses within 2% of fp32 "
                         f"(worst {worst:.2e})")


def main():
    trident, _ = binaries_or_skip()
    torch.set_num_threads(1)
    check_reference()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gpt2", "llama"):
            check_training(trident, tmp, name)
        check_stream(trident, tmp)
        check_nothing_counted(trident, tmp)
        check_layouts(trident, tmp)
        check_bf16_layouts(trident, tmp)
        check_lora_and_bf16(trident, tmp)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
