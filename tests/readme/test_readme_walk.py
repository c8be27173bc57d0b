#!/usr/bin/python3
"""Walks README.md as a newcomer would: every ```sh block, in order, each command on what the
ones before it made, in a scratch directory laid out as the repository (build/, configs/,
scripts/, data/gpt2's tokenizer files, README.md and docs/ linked in; data/ and runs/ its
own). A command that fails fails the test, naming it. Blocks for other machines (GPUs,
Slurm) and long runs are ```bash in README.md and are not run.

Reductions, so that the walk takes a minute or two rather than an hour; each keeps what the
command does and only makes it shorter:
  - a command that trains (`trident train`, directly or under mpirun, or scripts/run.sh)
    runs ceil(S / 100) steps, where S is its line's training.steps or else its
    config's (the quickstart's 300-step job runs 3, its resume to 400 runs on to 4): an
    appended --set training.steps; and at most 16 sequences per validation and 8 tokens in
    the sample after training;
  - a checkpoint named by its step, step_000300, is named by the step it has in the walk
    (step_000003), scaled as the steps are;
  - `generate` generates 8 tokens (--tokens 8); `bench` times 1 step after no warm-up;
  - scripts/run.sh runs with TRIDENT_SKIP_SETUP=1: the build is the one under test (set-up
    itself runs in scripts/test.sh).
The walk runs as a fresh machine would after scripts/run.sh's own install step
(fresh_machine.py): a Python module or a program of a Debian package that run.sh did not
install is missing, so the Quickstart's follow-up commands (scripts/plot_metrics among them)
pass only where run.sh installs what they use.

The ```bash blocks' trainings (GPU grids, long runs) are checked as far as this machine
can: each `trident train` or `trident plan` line runs as `trident plan` of its config and
options, which must accept them, lay out as many ranks as a training's mpirun starts, and fit
every stage in the `--device-memory` a plan line gives.

Then what the walk made is checked: every command that trains kept its checkpoints (its
`output:` line names a checkpoint.dir, where the next command looks), the quickstart's run
resumed at its last step (its metrics file steps 0 .. 4 and nothing else), the Hugging Face
export has its config.json and a run from it validates at the exported checkpoint's last
validation loss, and the LoRA recipe left its adapters.

Exit status: 0 passed, 1 failed, 77 skipped (no mpirun, or no matplotlib for plot_metrics).
"""
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from mpi_harness import plotting_run_or_skip  # noqa: E402

import fresh_machine  # noqa: E402

MARK = "readme.walk: "  # before each command's output: its time and the command
STEPS_DIVISOR = 100
SAMPLE_TOKENS = 8
EVAL_SEQUENCES = 16


def sh_blocks(readme, fence="```sh"):
    """The commands of README's ```sh blocks (or those of `fence`), in order: continuation
    lines joined, blank and comment lines left out."""
    commands, inside, pending = [], False, ""
    for line in readme.split("\n"):
        if not inside:
            inside = line.strip() == fence
            continue
        if line.strip() == "```":
            inside = False
            continue
        line = line.strip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def config_value(root, config, key):
    """`key: N` (an integer) of a config file, or None."""
    with open(os.path.join(root, config)) as f:
        m = re.search(rf"^\s+{key}:\s*(\d+)", f.read(), re.M)
    return int(m.group(1)) if m else None


def walked_steps(steps):
    return math.ceil(steps / STEPS_DIVISOR)


def reduce(command, root):
    """The command as the walk runs it (see the module's text)."""
    command = re.sub(r"step_(\d{6})", lambda m: f"step_{walked_steps(int(m.group(1))):06d}",
                     command)
    words = shlex.split(command, comments=True)
    if "generate" in words:
        if "--tokens" in words:
            return re.sub(r"--tokens \d+", f"--tokens {SAMPLE_TOKENS}", command)
        return f"{command} --tokens {SAMPLE_TOKENS}"
    if "bench" in words:
        return re.sub(r"--warmup \d+", "--warmup 0", re.sub(r"--steps \d+", "--steps 1", command))
    trains = "train" in words and any(w.endswith("trident") for w in words)
    if words and words[0] == "scripts/run.sh":
        trains, config = True, "configs/default.yaml"
        command = "TRIDENT_SKIP_SETUP=1 " + command
    elif trains:
        config = words[words.index("--config") + 1]
    if not trains:
        return command
    steps = [int(m) for m in re.findall(r"training\.steps=(\d+)", command)]
    total = steps[-1] if steps else config_value(root, config, "steps")
    extra = [f"training.steps={walked_steps(total)}"]
    if (config_value(root, config, "sample_tokens") or 0) > SAMPLE_TOKENS:
        extra.append(f"logging.sample_tokens={SAMPLE_TOKENS}")
    if (config_value(root, config, "eval_sequences") or 0) > EVAL_SEQUENCES:
        extra.append(f"training.eval_sequences={EVAL_SEQUENCES}")
    # Before a trailing comment, if any.
    code, hash_, comment = command.partition(" #")
    return code.rstrip() + "".join(f" --set {e}" for e in extra) + (f" #{comment}" if hash_ else "")


def as_plan(command, trident):
    """A ```bash block's `trident train` or `trident plan` line as `trident plan` of the same
    config and options, and the ranks a training's mpirun starts (1 without; None for a plan,
    whose config says); None for other lines."""
    words = shlex.split(command, comments=True)
    at = next((i for i, w in enumerate(words) if w.endswith("build/trident")), None)
    if at is None or words[at + 1] not in ("train", "plan"):
        return None
    ranks = int(words[words.index("-np") + 1]) if "-np" in words else 1
    return [trident, "plan"] + words[at + 2:], ranks if words[at + 1] == "train" else None


def check_bash_trainings(readme, source, trident):
    """Every training of the ```bash blocks, planned (see the module's text); the failures."""
    failures = []
    for command in sh_blocks(readme, "```bash"):
        planned = as_plan(command, trident)
        if planned is None:
            continue
        args, ranks = planned
        p = subprocess.run(args, cwd=source, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        laid_out = re.search(r"\) = (\d+) ranks?", p.stdout)
        ok = p.returncode == 0 and laid_out is not None
        if ranks is not None:
            ok = ok and int(laid_out.group(1)) == ranks
        if "--device-memory" in args:
            fits = re.findall(r" (yes|no) \(", p.stdout)
            ok = ok and fits and all(f == "yes" for f in fits)
        print(("ok   " if ok else "FAIL ") + f"planned: {command}", flush=True)
        if not ok:
            print(p.stdout[-2000:])
            failures.append(f"```bash line planned: {command}")
    return failures


def workspace(source, build, tmp):
    """The scratch repository: the parts the README reads linked in, data/ and runs/ its own."""
    for name in ("configs", "scripts", "README.md", "docs"):
        os.symlink(os.path.join(source, name), os.path.join(tmp, name))
    os.symlink(build, os.path.join(tmp, "build"))
    os.makedirs(os.path.join(tmp, "data", "gpt2"))
    for name in ("encoder.json", "vocab.bpe", "Encoder.js"):
        os.symlink(os.path.join(source, "data", "gpt2", name), os.path.join(tmp, "data", "gpt2", name))


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_results(tmp, walked):
    """What the walk made, beyond every command's exit status; `walked`: [(command, its
    output)]. Returns the failures."""
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    for command, output in walked:
        if "\noutput: checkpoints " in output:
            check("\noutput: checkpoints none" not in output,
                  f"keeps its checkpoints where the next command looks: {command}")

    quick = metrics(os.path.join(tmp, "runs/default/metrics.jsonl"))
    check([r["step"] for r in quick] == [0, 1, 2, 3, 4],
          f"runs/default: steps 0 .. 3, then resumed on to 4, in one metrics file "
          f"({[r['step'] for r in quick]})")
    check(os.path.exists(os.path.join(tmp, "runs/hf/config.json")),
          "runs/hf: export wrote config.json beside model.safetensors")
    exported = [r["val_loss"] for r in quick if "val_loss" in r][-1]
    from_hf = metrics(os.path.join(tmp, "runs/from-hf/metrics.jsonl"))[0]
    check(from_hf["step"] == 0 and abs(from_hf["val_loss"] - exported) <= 1e-6 * exported,
          f"runs/from-hf validates before training at runs/default's last validation loss "
          f"({from_hf.get('val_loss')} against {exported})")
    check(os.path.exists(os.path.join(tmp, "runs/kjv-lora/adapters.safetensors")),
          "runs/kjv-lora: the adapters exported")
    return failures


def main():
    a = plotting_run_or_skip()
    with open(os.path.join(a.source_dir, "README.md")) as f:
        readme = f.read()
    commands = sh_blocks(readme)
    planned_failures = check_bash_trainings(readme, a.source_dir, os.path.abspath(a.trident))
    with tempfile.TemporaryDirectory() as tmp:
        workspace(os.path.abspath(a.source_dir), os.path.dirname(os.path.abspath(a.trident)), tmp)
        env, fresh_files = fresh_machine.prepare(a.source_dir, tmp)
        script = ["set -euo pipefail"]
        for command in commands:
            walked = reduce(command, tmp)
            missing = fresh_machine.missing_programs(walked, tmp, fresh_files)
            if missing:
                print(f"FAIL README command runs what scripts/run.sh does not install "
                      f"({', '.join(missing)}): {command}")
                return 1
            script.append(f"echo \"{MARK}[$SECONDS s]\" {shlex.quote('$ ' + walked)}")
            script.append(walked)
        # Generated text may end a token inside a character (byte-level BPE): replaced here.
        p = subprocess.run(["bash", "-c", "\n".join(script)], cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, errors="replace", timeout=1200,
                           env=env)
        print(p.stdout[-20000:])
        # [(command, its output)] in order, split at each command's mark.
        walked = [(part.partition("$ ")[2].partition("\n")[0], part.partition("\n")[2])
                  for part in p.stdout.split(MARK)[1:]]
        if p.returncode != 0:
            print(f"FAIL README command {len(walked)} of {len(commands)} exited {p.returncode}: "
                  f"{walked[-1][0] if walked else '(none)'}")
            return 1
        print(f"ok   all {len(commands)} commands of README's sh blocks ran")
        failures = planned_failures + check_results(tmp, walked)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
