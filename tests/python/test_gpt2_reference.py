# Proves Trident's GPT-2 against an independent float64 PyTorch GPT-2 (gpt2_reference.py):
#   1. gradients: the loss and every parameter gradient of one global batch, as written by the
#      trident_model_dump tool, within 1e-5 relative (max|a-b| / max|b| per tensor); once with
#      weights saved under "transformer." names and once without, and with gradient accumulation
#      over two microbatches;
#   2. training: ten AdamW steps of `trident train` (weight decay, warmup, cosine decay, gradient
#      clipping that triggers on some steps and not others), step by step against torch.optim.AdamW: loss 1e-5 relative,
#      grad_norm 1e-4 relative, lr exact up to printing.
#
# Run by ctest as: /usr/bin/python3 test_gpt2_reference.py --trident BIN --tools-dir DIR
# Exit status: 0 all checks passed, 1 a check failed, 77 skipped (torch or numpy missing).

import argparse
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: the PyTorch reference needs torch and numpy ({e}); "
          f"install Debian's python3-torch and run with /usr/bin/python3")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_reference as ref  # noqa: E402

GRAD_TOLERANCE = 1e-5
LOSS_TOLERANCE = 1e-5
GRAD_NORM_TOLERANCE = 1e-4
LR_TOLERANCE = 1e-6  # the lr is computed in double; only its printing may round it

# Small, but with a vocabulary that needs padding (100 -> 128) and two microbatches per step.
SHAPE = ref.GPTShape(vocab=100, seq_len=16, layers=2, hidden=32, heads=4, ffn=128)
MICRO_BATCH = 2
GLOBAL_BATCH = 4

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def config_sections(weights, shard, training, metrics=None):
    return {
        "model": {"vocab_size": SHAPE.vocab, "seq_len": SHAPE.seq_len, "layers": SHAPE.layers,
                  "hidden": SHAPE.hidden, "heads": SHAPE.heads, "ffn_hidden": SHAPE.ffn,
                  "dropout": 0.0, "init_std": 0.02, "init_from": weights},
        "training": {"micro_batch": MICRO_BATCH, "global_batch": GLOBAL_BATCH, "threads": 1,
                     **training},
        "data": {"train": shard, "valid": None, "shuffle": False},
        "logging": {"interval": 1, "metrics": metrics},
        "checkpoint": {"dir": None},
        "device": "cpu",
    }


def run(command, what):
    """Runs a Trident program; on failure prints its output and returns None."""
    print("$ " + " ".join(command), flush=True)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        check(what, False, "timed out after 600 s")
        return None
    if done.returncode != 0:
        check(what, False, f"exit status {done.returncode}\n--- stdout ---\n{done.stdout[-4000:]}"
                           f"\n--- stderr ---\n{done.stderr[-4000:]}")
        return None
    return done


def random_tokens(count, seed):
    return np.random.default_rng(seed).integers(0, SHAPE.vocab, size=count)


def reference_model(seed):
    model = ref.GPT2Reference(SHAPE)
    ref.random_init(model, seed)
    ref.round_to_float32(model)  # Trident reads F32; start from exactly those values
    return model


# ---------------------------------------------------------------------------------------------
# 1. Loss and every gradient of one global batch.

def test_gradients(tmp, dump_tool, with_prefix, token_count, seed):
    label = "prefixed" if with_prefix else "unprefixed"
    model = reference_model(seed)
    tokens = random_tokens(token_count, seed + 1)
    weights = os.path.join(tmp, f"weights_{label}.safetensors")
    shard = os.path.join(tmp, f"tokens_{label}.bin")
    config = os.path.join(tmp, f"dump_{label}.yaml")
    output = os.path.join(tmp, f"grads_{label}.safetensors")
    ref.save_hf_weights(model, weights, with_prefix)
    ref.write_llmc_shard(shard, tokens)
    ref.write_config(config, config_sections(weights, shard, {"steps": 1, "seed": seed}))

    windows = (token_count - 1) // SHAPE.seq_len
    print(f"-- gradients, weights {label}, {token_count} tokens ({windows} windows, "
          f"step 0 takes {GLOBAL_BATCH} samples in microbatches of {MICRO_BATCH})")
    if run([dump_tool, "--config", config, "--output", output], f"dump tool ({label})") is None:
        return

    inputs, targets = ref.step_batch(tokens, 0, GLOBAL_BATCH, SHAPE.seq_len)
    loss = model.loss(inputs, targets)
    loss.backward()
    expected = {"transformer." + n: p.grad.numpy() for n, p in model.named_parameters()}
    expected["loss"] = np.array([loss.item()])

    dumped, _ = ref.read_safetensors(output)
    missing = sorted(set(expected) - set(dumped))
    extra = sorted(set(dumped) - set(expected))
    check(f"dump names ({label})", not missing and not extra,
          f"{len(dumped)} tensors; missing {missing or 'none'}, unexpected {extra or 'none'}")

    worst_name, worst = None, 0.0
    for name in expected:
        if name not in dumped:
            continue
        got, want = dumped[name], expected[name]
        if got.shape != want.shape:
            check(f"{name} ({label})", False, f"shape {list(got.shape)}, want {list(want.shape)}")
            continue
        if got.dtype != np.float32:
            check(f"{name} ({label})", False, f"dtype {got.dtype}, want float32")
        error = ref.relative_error(got, want)
        check(f"{'loss' if name == 'loss' else 'grad ' + name} ({label})", error <= GRAD_TOLERANCE,
              f"max rel err {error:.3e} (scale {np.max(np.abs(want)):.3e})")
        if name != "loss" and error >= worst:
            worst_name, worst = name, error
    print(f"-- gradients ({label}): loss {float(dumped.get('loss', [np.nan])[0]):.8f} vs "
          f"{loss.item():.8f}; worst gradient {worst_name} at {worst:.3e}")


# ---------------------------------------------------------------------------------------------
# 2. Ten AdamW steps.

TRAINING = {"steps": 10, "lr": 5.0e-3, "min_lr": 5.0e-4, "warmup_steps": 3, "decay": "cosine",
            "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8, "grad_clip": 0.8,
            "seed": 7}


def read_metrics(path):
    """The per-step records of a metrics JSON-lines file, ordered by step (other records, such
    as validation lines without a training loss, are ignored)."""
    records = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if "step" in record and "loss" in record and "grad_norm" in record:
                records.append(record)
    return sorted(records, key=lambda r: r["step"])


def reference_training(model, tokens, steps):
    """float64 torch run of the same steps: per step (loss before the update, grad norm before
    clipping, lr)."""
    t = TRAINING
    optimizer = ref.make_adamw(model, t["lr"], t["beta1"], t["beta2"], t["eps"],
                               t["weight_decay"])
    history = []
    for step in range(steps):
        lr = ref.lr_at(step, t["lr"], t["min_lr"], t["warmup_steps"], t["steps"], t["decay"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = ref.step_batch(tokens, step, GLOBAL_BATCH, SHAPE.seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(inputs, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        optimizer.step()
        history.append((loss.item(), norm.item(), lr))
    return history


def test_training(tmp, trident):
    seed = 21
    model = reference_model(seed)
    # 10 steps of 4 windows of 16 need 640 tokens; 400 give 24 windows, so the data wraps.
    tokens = random_tokens(400, seed + 1)
    weights = os.path.join(tmp, "train_weights.safetensors")
    shard = os.path.join(tmp, "train_tokens.bin")
    config = os.path.join(tmp, "train.yaml")
    metrics = os.path.join(tmp, "metrics.jsonl")
    ref.save_hf_weights(model, weights, with_prefix=True)
    ref.write_llmc_shard(shard, tokens)
    ref.write_config(config, config_sections(weights, shard, TRAINING, metrics))

    steps = TRAINING["steps"]
    print(f"-- training: {steps} AdamW steps, {TRAINING}")
    if run([trident, "train", "--config", config, "--set", "training.threads=2"],
           "trident train") is None:
        return
    if not os.path.exists(metrics):
        check("metrics file", False, f"{metrics} was not written")
        return
    records = read_metrics(metrics)
    numbers = [r["step"] for r in records]
    first = numbers[0] if numbers else None
    check("metrics steps", len(records) == steps and first in (0, 1)
          and numbers == list(range(first, first + steps)),
          f"steps {numbers} (want {steps} consecutive, from 0 or 1)")
    if len(records) != steps or first not in (0, 1):
        return
    print(f"-- metrics count steps from {first}; record of step {first} is step index 0")

    expected = reference_training(model, tokens, steps)
    worst = {"loss": 0.0, "grad_norm": 0.0, "lr": 0.0}
    for index, (record, (loss, norm, lr)) in enumerate(zip(records, expected)):
        errors = {"loss": abs(record["loss"] - loss) / abs(loss),
                  "grad_norm": abs(record["grad_norm"] - norm) / abs(norm),
                  "lr": abs(record["lr"] - lr) / abs(lr)}
        ok = (errors["loss"] <= LOSS_TOLERANCE and errors["grad_norm"] <= GRAD_NORM_TOLERANCE
              and errors["lr"] <= LR_TOLERANCE and not record.get("skipped", False))
        check(f"step {record['step']}", ok,
              f"loss {record['loss']:.8f} vs {loss:.8f} (rel {errors['loss']:.2e}), "
              f"grad_norm {record['grad_norm']:.6e} vs {norm:.6e} (rel {errors['grad_norm']:.2e}), "
              f"lr {record['lr']:.8e} vs {lr:.8e} (rel {errors['lr']:.1e}), "
              f"skipped {record.get('skipped')}")
        for key in worst:
            worst[key] = max(worst[key], errors[key])
    # grad_clip sits inside the range of observed norms, so both branches of clipping run.
    limit = TRAINING["grad_clip"]
    clipped = [norm > limit for _, norm, _ in expected]
    clipped_trident = [r["grad_norm"] > limit for r in records]
    check("clipping triggers", any(clipped) and not all(clipped) and clipped == clipped_trident,
          f"grad_norm > grad_clip {limit} on {sum(clipped_trident)} of {steps} Trident steps "
          f"and {sum(clipped)} reference steps, the same steps: {clipped == clipped_trident}")
    missing = [k for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "skipped")
               if k not in records[0]]
    check("metrics keys", not missing, f"missing {missing or 'none'}")
    print(f"-- training: max rel err loss {worst['loss']:.3e}, grad_norm "
          f"{worst['grad_norm']:.3e}, lr {worst['lr']:.3e}")


def main():
    parser = argparse.ArgumentParser(description="Trident against a float64 PyTorch GPT-2")
    parser.add_argument("--trident", required=True, help="the trident binary")
    parser.add_argument("--tools-dir", required=True,
                        help="the directory holding trident_model_dump")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the configs, data and outputs here and keep them")
    args = parser.parse_args()
    torch.set_num_threads(1)

    dump_tool = os.path.join(args.tools_dir, "trident_model_dump")
    for path, hint in ((args.trident, "build the trident target"),
                       (dump_tool, "build the trident_model_dump target")):
        if not os.access(path, os.X_OK):
            print(f"FAIL: {path} is missing or not executable ({hint})")
            return 1

    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        # 1000 tokens: step 0's windows do not wrap; 54 tokens: 3 windows, so sample 3 wraps.
        test_gradients(tmp, dump_tool, with_prefix=True, token_count=1000, seed=1)
        test_gradients(tmp, dump_tool, with_prefix=False, token_count=54, seed=2)
        test_training(tmp, args.trident)

    if failures:
        print(f"FAILED {len(failures)} check(s): {', '.join(failures)}")
        return 1
    print("all PyTorch reference checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
