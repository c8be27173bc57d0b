#!/usr/bin/python3
"""Pipeline parallelism under mpirun: every schedule trains the same model as one process.

P = 2 and 4 with 1F1B, GPipe and the zero-bubble ZB-H1 and ZB-H2, P = 2 with the interleaved
schedule (v = 2), and P = 2 combined with M = 2 (and sequence parallelism), with the layers cut
uniformly, by cost (auto) or as given (chunks without layers included): the loss and every
gathered gradient of one
global batch (tests/tools/model_dump) and the losses of 10 training steps (with validation)
match P = 1 within 1e-5 relative. The zero-bubble schedules give 1F1B's losses bitwise, with
M, sequence parallelism, D with ZeRO-1, recompute and bf16. logging.trace writes a Chrome
trace with every rank's spans; auto's cuts move layers away from the stage with the head.
Uniform cuts of layers not divisible by P·v, counts that do not add up to the layers, and
microbatches not a multiple of P for the interleaved schedule are refused with one clear
message.

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import collections
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses,  # noqa: E402
                         read_safetensors, run, tiny_run, worst_tensor_diff)

# Checkpoints of every step of a 10-step run: step 1's Adam moments are (1 - beta) g and
# (1 - beta2) g^2, the whole model's gradient element by element.
EVERY_STEP = ["--set", "checkpoint.interval=1", "--set", "checkpoint.keep=10"]
MOMENTS = ("exp_avg", "exp_avg_sq")

# (P, M, schedule, v, sequence parallel, parallel.stage_layers)
LAYOUTS = [(2, 1, "1f1b", 1, False, "uniform"), (4, 1, "1f1b", 1, False, "uniform"),
           (2, 1, "gpipe", 1, False, "uniform"), (4, 1, "gpipe", 1, False, "auto"),
           (2, 1, "interleaved", 2, False, "uniform"), (2, 2, "1f1b", 1, False, "auto"),
           (2, 2, "interleaved", 2, True, "uniform"), (2, 1, "1f1b", 1, False, "[3,1]"),
           (2, 1, "1f1b", 1, False, "[4,0]"), (2, 1, "interleaved", 2, False, "[0,2,1,1]"),
           (2, 1, "zb-h1", 1, False, "uniform"), (4, 1, "zb-h2", 1, False, "auto"),
           (2, 2, "zb-h1", 1, True, "auto")]


def layout_args(p, m, schedule, v, sp, cut="auto"):
    return ["--set", f"parallel.pipeline={p}", "--set", f"parallel.tensor={m}",
            "--set", f"parallel.schedule={schedule}", "--set", f"parallel.virtual_stages={v}",
            "--set", f"parallel.sequence_parallel={'true' if sp else 'false'}",
            "--set", f"parallel.stage_layers={cut}"]


def stage_seconds(trace):
    """Each rank's compute time a step in a Chrome trace: its forward and backward spans
    summed per step (a step ends where the rank's optimizer span begins), the least of its
    steps (other processes on the machine only ever add to a span)."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    seconds = {}
    for rank in {e["pid"] for e in events}:
        mine = sorted((e["ts"], e["dur"], e["name"]) for e in events if e["pid"] == rank)
        steps, busy = [], 0.0
        for start, duration, name in mine:
            if name == "optimizer":
                steps.append(busy)
                busy = 0.0
            elif name in ("forward", "backward"):
                busy += duration
        seconds[rank] = min(steps) / 1e6
    return seconds


def main():
    trident, dump = binaries_or_skip()

    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        # 4 layers (P·v up to 4), 4 microbatches per step (a multiple of P = 2 and 4).
        base = tiny_run(tmp, ["model.layers=4", "model.dropout=0.1", "training.global_batch=8",
                              "training.eval_interval=5", "training.eval_batches=2",
                              f"data.valid={path('train.bin')}"])
        run([trident, "train"] + base + ["--set", "training.steps=1", "--set",
                                         f"checkpoint.dir={path('ck')}"])
        run([trident, "export", "--checkpoint", path("ck"), "--output", path("w.safetensors")])
        init = ["--set", f"model.init_from={path('w.safetensors')}"]

        run([dump] + base + init + ["--output", path("g1.safetensors")], ranks=1)
        ref_grads = read_safetensors(path("g1.safetensors"))
        run([trident, "train"] + base + init + EVERY_STEP +
            ["--set", f"logging.metrics={path('m1.jsonl')}", "--set", f"checkpoint.dir={path('ck1')}"],
            ranks=1)
        ref_rows = losses(path("m1.jsonl"))

        for index, (p, m, schedule, v, sp, cut) in enumerate(LAYOUTS):
            name = (f"P={p} M={m} {schedule}{f' v={v}' if v > 1 else ''}{' +SP' if sp else ''}"
                    f" layers {cut}")
            args = layout_args(p, m, schedule, v, sp, cut)
            out = path("g.safetensors")
            run([dump] + base + init + args + ["--output", out], ranks=p * m)
            got = read_safetensors(out)
            worst = worst_tensor_diff(got, ref_grads)
            check(sorted(got) == sorted(ref_grads) and worst[0] <= 1e-5,
                  f"{name}: loss and gradients within 1e-5 of P=1 (worst {worst[0]:.2e}, {worst[1]})")

            metrics, ck = path("m.jsonl"), path(f"ck_layout{index}")
            run([trident, "train"] + base + init + args + EVERY_STEP +
                ["--set", f"logging.metrics={metrics}", "--set", f"checkpoint.dir={ck}"], ranks=p * m)
            rows = losses(metrics)
            differ = checkpoints_differ(f"{ck}/step_000001", path("ck1/step_000001"), 1e-5, MOMENTS)
            check(differ is None, f"{name}: step 1's Adam moments, every element of every tensor, "
                                  f"within 1e-5 of P=1 ({differ or 'all'})")
            worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(rows, ref_rows))
            val = [(x["val_loss"], y["val_loss"]) for x, y in zip(rows, ref_rows) if "val_loss" in y]
            worst_val = max(abs(x - y) / abs(y) for x, y in val)
            check(len(rows) == 10 and worst <= 1e-5 and len(val) == 2 and worst_val <= 1e-5,
                  f"{name}: 10-step losses (dropout 0.1) and validation within 1e-5 of P=1 "
                  f"(worst {worst:.2e}, validation {worst_val:.2e})")

        # Zero-bubble: 1F1B's losses and gradient norms bitwise (the W's add into each
        # gradient in 1F1B's order), on grids with tensor, sequence and data parallelism,
        # ZeRO-1, recompute and bf16.
        for p, m, d, extra in [(2, 1, 1, ["training.recompute=full"]),
                               (2, 2, 1, ["parallel.sequence_parallel=true",
                                          "training.recompute=selective"]),
                               (2, 1, 2, ["parallel.zero_stage=1", "training.precision=bf16"])]:
            runs = {}
            name = f"{p}x{m}x{d} {' '.join(extra)}"
            for schedule in ("1f1b", "zb-h1", "zb-h2"):
                metrics = path(f"zb_{schedule}.jsonl")
                ck = path(f"zb_{name.replace(' ', '_')}_{schedule}")
                args = layout_args(p, m, schedule, 1, False, "uniform")
                args += ["--set", f"parallel.data={d}"] + sum((["--set", e] for e in extra), [])
                run([trident, "train"] + base + init + args
                    + ["--set", f"logging.metrics={metrics}", "--set", f"checkpoint.dir={ck}"],
                    ranks=p * m * d)
                runs[schedule] = [(r["loss"], r["grad_norm"]) for r in losses(metrics)]
            check(len(runs["1f1b"]) == 10 and runs["zb-h1"] == runs["1f1b"] == runs["zb-h2"],
                  f"{name}: ZB-H1 and ZB-H2 train as 1F1B: losses and gradient norms")
            ck = lambda s: path(f"zb_{name.replace(' ', '_')}_{s}/step_000010")  # noqa: E731
            differ = checkpoints_differ(ck("zb-h1"), ck("1f1b")) or checkpoints_differ(ck("zb-h2"), ck("1f1b"))
            check(differ is None, f"{name}: ZB-H1 and ZB-H2 checkpoints after 10 steps equal 1F1B's "
                                  f"bitwise: weights, master weights, Adam moments ({differ or 'all'})")

        # Activations are held per microbatch in flight: rank 0 (stage 0) of P = 2 with 4
        # microbatches holds 2 under 1F1B (p - stage) and all 4 under GPipe; validation
        # passes release theirs at once.
        for schedule, expect in (("1f1b", 2), ("gpipe", 4)):
            metrics = path("a.jsonl")
            run([trident, "train"] + base + layout_args(2, 1, schedule, 1, False, "uniform")
                + ["--set", f"logging.metrics={metrics}"], ranks=2)
            held = {r["activation_sets"] for r in losses(metrics)}
            check(held == {expect}, f"{schedule}, P=2, m=4: stage 0 holds {expect} microbatches' "
                                    f"activations (seen {sorted(held)})")

        # Memory does not grow with the microbatches: under 1F1B stage 0 holds 2 activation
        # sets for 4 microbatches and for 16, and the pipeline's message buffers (received,
        # and the pool of outgoing ones) are bounded too, so its peak is the same. Each
        # message is 256 KB (micro batch 4 x 64 tokens x hidden 256, fp32): above MPI's eager
        # limits, so a send stays in flight until its receiver takes it, and a buffer per
        # send in flight would grow with the microbatches.
        peaks = []
        for batch in (16, 64):
            metrics = path(f"peak{batch}.jsonl")
            run([trident, "train"] + base + layout_args(2, 1, "1f1b", 1, False, "uniform")
                + ["--set", f"training.global_batch={batch}", "--set", "training.steps=2",
                   "--set", "model.hidden=256", "--set", "model.seq_len=64",
                   "--set", "training.micro_batch=4", "--set", "model.dropout=0",
                   "--set", f"logging.metrics={metrics}"], ranks=2)
            peaks.append(losses(metrics)[-1]["mem_peak_bytes"])
        check(peaks[0] == peaks[1], f"1F1B, P=2: stage 0's peak memory {peaks[0]} bytes with 4 "
                                    f"microbatches, {peaks[1]} with 16")

        # The Chrome trace of steps 2 and 3 on a 2 x 2 grid: one track per rank, each with a
        # forward and a backward per microbatch and the matching sends and receives.
        trace = path("trace.json")
        run([trident, "train"] + base + layout_args(2, 2, "1f1b", 1, False)
            + ["--set", f"logging.trace={trace}", "--set", "logging.trace_steps=2"], ranks=4)
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
        tracks = {e["pid"] for e in events if e["ph"] == "M"}
        count = collections.Counter((e["pid"], e["name"]) for e in events if e["ph"] == "X")
        # Per step: 4 microbatches; stage 0 sends activations and receives gradients, stage 1
        # the reverse, one each per microbatch.
        expected = {(r, n): 8 for r in range(4) for n in ("forward", "backward", "send", "recv")}
        expected.update({(r, "optimizer"): 2 for r in range(4)})
        check(tracks == {0, 1, 2, 3} and dict(count) == expected,
              f"Chrome trace: 4 tracks with every rank's spans ({sum(count.values())} spans)")

        # auto's cuts against uniform's. A head of about four layers' FLOPs (vocabulary 6656,
        # hidden 128) on 8 layers: uniform's last stage computes 4 layers and the head, auto
        # moves layers to the first stage. The time each stage computes (the trace's forward and
        # backward spans, summed per rank and step; its least step) is printed as a figure, not
        # asserted: speed is measured by the benchmark in docs/PERF.md ("Pipeline cuts balanced
        # by cost"), and on a shared machine another job's load moved one stage's time by half
        # (0.031 s to 0.059 s).
        share, layers = {}, {}
        for cut in ("uniform", "auto"):
            trace = path(f"cut_{cut}.json")
            out = run([trident, "train"] + base + layout_args(2, 1, "1f1b", 1, False, cut) + [
                "--set", "model.vocab_size=6656", "--set", "model.hidden=128",
                "--set", "model.ffn_hidden=512", "--set", "model.layers=8",
                "--set", "model.seq_len=32", "--set", "model.dropout=0",
                "--set", "training.micro_batch=1", "--set", "training.steps=9",
                "--set", f"logging.trace={trace}", "--set", "logging.trace_from=2",
                "--set", "logging.trace_steps=8"], ranks=2).stdout
            stages = stage_seconds(trace)
            share[cut] = max(stages.values()) / sum(stages.values())
            layers[cut] = [int(n) for n in
                           re.search(r"layers per chunk ([0-9, ]*[0-9])", out).group(1).split(",")]
            print(f"figure: stage_layers {cut}: the stages compute "
                  f"{' and '.join(f'{stages[r]:.4f}' for r in sorted(stages))} s a step, the "
                  f"busiest {share[cut]:.0%} of it (layers per chunk {layers[cut]})", flush=True)
        check(layers["uniform"] == [4, 4] and layers["auto"][0] > layers["auto"][1],
              f"stage cuts: uniform's {layers['uniform']}, auto's {layers['auto']} moves layers "
              f"to the first stage, away from the head")

        p = run([trident, "train"] + base + ["--set", "parallel.pipeline=3",
                                             "--set", "parallel.stage_layers=uniform"],
                ranks=3, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1
              and "model.layers (4) must be a multiple of parallel.pipeline" in p.stdout,
              f"uniform cuts of layers not divisible by P·v: one message, exit {p.returncode}")
        p = run([trident, "train"] + base + ["--set", "parallel.pipeline=2",
                                             "--set", "parallel.stage_layers=[2,1]"],
                ranks=2, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1
              and "the counts add up to 3, but model.layers is 4" in p.stdout,
              f"stage_layers not adding up to the layers: one message, exit {p.returncode}")
        p = run([trident, "train"] + base + layout_args(4, 1, "interleaved", 2, False)
                + ["--set", "model.layers=8", "--set", "training.global_batch=12"],
                ranks=4, expect_ok=False)
        check(p.returncode != 0 and p.stdout.count("trident: error") == 1
              and "multiple of parallel.pipeline (4)" in p.stdout,
              f"interleaved with microbatches not a multiple of P: one message, exit {p.returncode}")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
