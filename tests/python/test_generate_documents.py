# Generation over packed documents: `trident generate --temperature 0` from a checkpoint trained
# with data.documents: mask continues as the float64 GPT-2 reference (gpt2_reference.py) does
# when each token sees only its own document at positions from 0 — the reference reruns the
# whole visible context for every token — through a prompt holding an earlier document, a
# prompt that ends with the eod (the next token starts a new document alone at position 0) and
# the window's slides. GPT-2's learned positions make the per-document positions matter. The
# same weights without the mask must continue otherwise (else the check would be vacuous).
#
# The weights reach `trident generate` as a checkpoint of `trident train` with init_from the
# reference's file and a learning rate of 1e-30 (one step leaves every fp32 weight as it was).
#
# Run by ctest as: /usr/bin/python3 test_generate_documents.py --trident BIN --tools-dir DIR
# Exit status: 0 passed, 1 failed, 77 skipped (torch or numpy missing).

import argparse
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

SHAPE = ref.GPTShape(vocab=256, seq_len=16, layers=2, hidden=32, heads=4, ffn=64)
EOD = ord("|")
TOKENS = 40  # past seq_len: the window slides


def visible(context, eod):
    """The tokens the newest one sees: after the last eod before it (eod None: all)."""
    start = 0
    for j in range(len(context) - 1):
        if eod is not None and context[j] == eod:
            start = j + 1
    return context[start:]


def reference_greedy(model, prompt, count, eod):
    """Greedy tokens, each from a rerun over the visible window at positions 0 ..; the window
    as generation keeps it: the last seq_len tokens, then after a full one the last half."""
    T = SHAPE.seq_len
    context = list(prompt)
    window, out = visible(context, eod)[-T:], []
    for _ in range(count):
        with torch.no_grad():
            token = int(torch.argmax(model.logits(torch.tensor([window]))[0, -1]))
        new_document = eod is not None and context[-1] == eod
        context.append(token)
        out.append(token)
        if new_document:
            window = [token]
        elif len(window) < T:
            window = window + [token]
        else:
            window = visible(context, eod)[-(T // 2):]
    return out


def checkpoint(trident, tmp, model, documents):
    weights, shard = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "t.bin")
    config, run_dir = os.path.join(tmp, f"{documents}.yaml"), os.path.join(tmp, documents)
    ref.save_hf_weights(model, weights, with_prefix=False)
    tokens = np.arange(400) % SHAPE.vocab
    tokens[::7] = EOD
    ref.write_llmc_shard(shard, tokens)
    s = SHAPE
    ref.write_config(config, {
        "model": {"vocab_size": s.vocab, "seq_len": s.seq_len, "layers": s.layers,
                  "hidden": s.hidden, "heads": s.heads, "ffn_hidden": s.ffn,
                  "init_from": weights},
        "training": {"micro_batch": 1, "global_batch": 1, "steps": 1, "lr": 1.0e-30,
                     "min_lr": 0.0, "warmup_steps": 0, "threads": 1},
        "data": {"train": shard, "valid": None, "documents": documents, "eod_token": EOD},
        "checkpoint": {"dir": run_dir},
        "device": "cpu",
    })
    done = subprocess.run([trident, "train", "--config", config], capture_output=True,
                          timeout=600)
    if done.returncode != 0:
        sys.exit(f"FAIL  train: exit status {done.returncode}\n{done.stdout.decode()[-3000:]}")
    return run_dir


def generate(trident, run_dir, prompt):
    command = [trident, "generate", "--checkpoint", run_dir, "--prompt", prompt.decode(),
               "--tokens", str(TOKENS), "--temperature", "0"]
    print("$ " + " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"FAIL  exit status {done.returncode}\n{done.stderr.decode()[-3000:]}")
    text = done.stdout
    assert text.startswith(prompt) and text.endswith(b"\n"), text
    return list(text[len(prompt):-1]), done.stderr.decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    args = parser.parse_args()
    model = ref.GPT2Reference(SHAPE).double()
    ref.random_init(model, 23, std=0.5)
    failed = 0

    def check(ok, what):
        nonlocal failed
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        masked = checkpoint(args.trident, tmp, model, "mask")
        stream = checkpoint(args.trident, tmp, model, "stream")
        for prompt in (b"In the|And God", b"In the beginning|God|"):
            got, note = generate(args.trident, masked, prompt)
            want = reference_greedy(model, list(prompt), TOKENS, EOD)
            check(got == want and "ends after token 124" in note,
                  f"mask, prompt {prompt}: the reference's tokens per document\n"
                  f"      trident   {got}\n      reference {want}")
            plain, note = generate(args.trident, stream, prompt)
            check(plain == reference_greedy(model, list(prompt), TOKENS, None) and plain != got
                  and "documents" not in note,
                  f"stream, prompt {prompt}: one sequence, another continuation")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
