#!/usr/bin/python3
"""ZeRO stages 2 and 3 under mpirun, beside stages 0 and 1.

Losses and gradient norms of 10 steps (dropout 0.1) within 1e-5 of one process at D = 2 and
4, on 1x2x2 with sequence parallelism, and (stage 2) on 2x1x2, with the gradients reduced every
microbatch or kept whole until the last; overlapped and not, the same bits. Memory per rank as
the allocator measures it: gradients Psi*4/D (stages 2, 3), weights Psi*4/D (stage 3), where
Psi is the stage's flat buffer. Traffic per step and rank under ring algorithms, with one
microbatch per replica: 2*Psi*(D-1)/D for stage 2, 3*Psi*(D-1)/D for stage 3 (in 4-byte
elements); with m microbatches, the reduce-scatter m times when accumulation is sharded.
Checkpoints reshard across stages: a stage-3 run resumes at stage 1, that one at stage 3 on
D = 4, and stage 3 at stage 2 on a pipeline. Stage 3 on a pipeline (2x1x2) with 1F1B,
interleaved, ZB-H1 and ZB-H2, resharding after every use or not: step 1's Adam moments within
1e-5 of one process, step 10's checkpoint bitwise stage 2's, and the all-gathers each step as
the data group counts them (2m per layer against 1).

Needs only the standard library and mpirun; exit 77 (skipped) without mpirun.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_harness import (binaries_or_skip, check, checkpoints_differ, failures, losses, run,  # noqa: E402
                         tiny_run, worst)

TOL = 1e-5


def main():
    trident, _ = binaries_or_skip()
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)  # noqa: E731
        base = tiny_run(tmp, ["model.layers=4", "model.dropout=0.1", "training.global_batch=16",
                              "data.shuffle=true"])

        def train(ranks, name, overrides, expect_ok=True):
            args = [trident, "train"] + base
            for o in overrides + [f"logging.metrics={path(name + '.jsonl')}"]:
                args += ["--set", o]
            p = run(args, ranks=None if ranks == 1 else ranks, expect_ok=expect_ok)
            return p if not expect_ok else losses(path(name + ".jsonl"))

        # Checkpoints of every step: step 1's Adam moments are the whole gradient, element by
        # element ((1 - beta) g and (1 - beta2) g^2).
        every_step = ["checkpoint.interval=1", "checkpoint.keep=10"]
        ref = train(1, "ref", ["checkpoint.dir=" + path("ck_ref")] + every_step)

        # (P, M, D, stage, extra overrides)
        layouts = [(1, 1, 2, 2, []), (1, 1, 2, 3, []), (1, 1, 4, 2, []), (1, 1, 4, 3, []),
                   (1, 2, 2, 2, ["parallel.sequence_parallel=true"]),
                   (1, 2, 2, 3, ["parallel.sequence_parallel=true"]),
                   (2, 1, 2, 2, []),
                   (1, 1, 2, 2, ["parallel.sharded_accumulation=false"]),
                   (1, 1, 2, 3, ["parallel.sharded_accumulation=false"])]
        stage0 = {}
        for d in (2, 4):
            stage0[d] = train(d, f"z0d{d}", [f"parallel.data={d}", "parallel.zero_stage=0"])[-1]
        for index, (p, m, d, zero, extra) in enumerate(layouts):
            name = f"{p}x{m}x{d} zero {zero}{' ' + ' '.join(extra) if extra else ''}"
            ck = path(f"ck_layout{index}")
            rows = train(p * m * d, "run", [f"parallel.pipeline={p}", f"parallel.tensor={m}",
                                            f"parallel.data={d}", f"parallel.zero_stage={zero}",
                                            f"checkpoint.dir={ck}"] + every_step + extra)
            differ = checkpoints_differ(f"{ck}/step_000001", path("ck_ref/step_000001"), TOL,
                                        ("exp_avg", "exp_avg_sq"))
            check(differ is None, f"{name}: step 1's Adam moments, every element, within 1e-5 of "
                                  f"1x1x1 ({differ or 'all'})")
            check(len(rows) == 10 and worst(rows, ref, "loss") <= TOL
                  and worst(rows, ref, "grad_norm") <= TOL,
                  f"{name}: losses and gradient norms within 1e-5 of 1x1x1 "
                  f"(worst {worst(rows, ref, 'loss'):.2e})")
            if (p, m) != (1, 1):
                continue
            # Memory of rank 0: the shards, against the whole buffers of stage 0.
            r, r0 = rows[-1], stage0[d]
            psi = r["mem_grads_bytes"] * d // 4  # elements of the unit-padded flat buffer
            whole = r0["mem_params_bytes"] // 4
            weights = psi * 4 // d if zero == 3 else psi * 4
            check(whole <= psi < whole + 6 * d and r["mem_params_bytes"] == weights
                  and 0 <= r["mem_optimizer_bytes"] - 12 * psi // d < 3 * 64,
                  f"{name}: gradients {r['mem_grads_bytes']} bytes = 4 x {psi} / {d}, weights "
                  f"{r['mem_params_bytes']} = 4 x {psi}{' / ' + str(d) if zero == 3 else ''}, "
                  f"optimizer {r['mem_optimizer_bytes']} = 12 x {psi} / {d} (+ rounding)")
            check(r["mem_peak_bytes"] < r0["mem_peak_bytes"],
                  f"{name}: peak {r['mem_peak_bytes']} bytes below stage 0's {r0['mem_peak_bytes']}")
            # Traffic: 4 microbatches per replica at D = 2, 2 at D = 4.
            mb = 16 // (2 * d)
            sharded = "parallel.sharded_accumulation=false" not in extra
            rs, ag = r["dp_reduce_scatter_bytes"], r["dp_all_gather_bytes"]
            expect_rs = 4 * psi * (mb if sharded else 1)
            expect_ag = 4 * psi // d * (2 * mb if zero == 3 else 1)
            check(rs == expect_rs and ag == expect_ag,
                  f"{name}: reduce-scatter {rs} bytes = 4 x {psi} x {mb if sharded else 1}, "
                  f"all-gather {ag} = 4 x {psi} / {d} x {2 * mb if zero == 3 else 1}")

        # One microbatch per replica: the paper's traffic per rank, ring algorithms.
        for d in (2, 4):
            for zero, factor in ((2, 2), (3, 3)):
                r = train(d, "one", [f"parallel.data={d}", f"parallel.zero_stage={zero}",
                                     f"training.global_batch={2 * d}"])[-1]
                psi = r["mem_grads_bytes"] * d // 4
                ring = (d - 1) / d * r["dp_reduce_scatter_bytes"] + (d - 1) * r["dp_all_gather_bytes"]
                check(abs(ring - factor * psi * (d - 1) / d * 4) < 1e-6,
                      f"D={d} zero {zero}, one microbatch: {ring:.0f} bytes sent per rank = "
                      f"{factor} x {psi} x ({d}-1)/{d} x 4")

        # Overlapped and not: the same bits.
        for zero in (2, 3):
            runs = []
            for overlap in ("true", "false"):
                rows = train(2, f"o{overlap}", ["parallel.data=2", f"parallel.zero_stage={zero}",
                                                f"parallel.overlap_grad_reduce={overlap}",
                                                f"parallel.overlap_param_gather={overlap}",
                                                f"checkpoint.dir={path(f'ov{zero}{overlap}')}"])
                runs.append([(x["loss"], x["grad_norm"]) for x in rows])
            check(len(runs[0]) == 10 and runs[0] == runs[1],
                  f"D=2 zero {zero}: overlapped and not, the same losses and norms")
            differ = checkpoints_differ(path(f"ov{zero}true/step_000010"),
                                        path(f"ov{zero}false/step_000010"))
            check(differ is None, f"D=2 zero {zero}: overlapped and not, the same checkpoint bitwise: "
                                  f"weights, master weights, Adam moments ({differ or 'all'})")

        # Checkpoints across stages: 3 -> 1, 1 -> 3 (D = 4), 3 -> 2 on a pipeline, 0 -> 3.
        train(2, "c3", ["parallel.data=2", "parallel.zero_stage=3", f"checkpoint.dir={path('ck3')}",
                        "checkpoint.interval=4"])
        for name, ranks, overrides, resume, start in [
                ("stage 3 -> stage 1", 2, ["parallel.data=2", "parallel.zero_stage=1",
                                           f"checkpoint.dir={path('ck1')}", "checkpoint.interval=4"],
                 path("ck3/step_000004"), 4),
                ("stage 1 -> stage 3 on D=4", 4, ["parallel.data=4", "parallel.zero_stage=3"],
                 path("ck1/step_000008"), 8),
                ("stage 3 -> stage 2 on 2x1x2", 4, ["parallel.pipeline=2", "parallel.data=2",
                                                    "parallel.zero_stage=2"],
                 path("ck3/step_000004"), 4),
                ("stage 0 (1x1x1) -> stage 3 on D=2", 2, ["parallel.data=2", "parallel.zero_stage=3"],
                 path("ck_ref/step_000004"), 4)]:
            rows = train(ranks, f"resumed{start}_{ranks}_{len(overrides)}", overrides + [f"checkpoint.resume={resume}"])
            check(len(rows) == 10 - start and worst(rows, ref[start:], "loss") <= TOL,
                  f"{name}: the uninterrupted losses from step {start}")

        # Stage 3 on a pipeline (P=2, D=2, 4 microbatches per replica), every schedule, each
        # unit's weights gathered for every use and kept through the step: the losses and
        # step 1's Adam moments (the whole gradient), every element, within 1e-5 of one
        # process, and step 10's checkpoint (weights, master weights, moments) bitwise that of
        # stage 2 with 1F1B on the same grid (above): the same reduce-scatters of the same sums
        # (each schedule adds a unit's microbatches in order; test_pipeline_parallel.py holds
        # the schedules bitwise equal), only the weights' gathers differ. Rank 0 (stage 0: wte,
        # wpe, 2 layers) counts its all-gathers of a step: per layer 2m resharded (forward,
        # backward; a zero-bubble W reads no weight), m for the embedding's units (no backward
        # reads them), and one per unit kept.
        stage2 = path(f"ck_layout{layouts.index((2, 1, 2, 2, []))}/step_000010")
        m, stage0_layers, embedding_units = 4, 2, 2
        expect_calls = {"true": 2 * m * stage0_layers + m * embedding_units,
                        "false": stage0_layers + embedding_units}
        for schedule, extra in [("1f1b", []), ("interleaved", ["parallel.virtual_stages=2"]),
                                ("zb-h1", []), ("zb-h2", [])]:
            for reshard in ("true", "false"):
                name = f"2x1x2 zero 3, {schedule}, reshard_after_forward {reshard}"
                ck = path(f"pp_{schedule}_{reshard}")
                rows = train(4, "pp_zero3", [
                    "parallel.pipeline=2", "parallel.data=2", "parallel.zero_stage=3",
                    f"parallel.schedule={schedule}", f"parallel.reshard_after_forward={reshard}",
                    f"checkpoint.dir={ck}"] + extra + every_step)
                differ = checkpoints_differ(f"{ck}/step_000001", path("ck_ref/step_000001"), TOL,
                                            ("exp_avg", "exp_avg_sq"))
                check(differ is None and len(rows) == 10 and worst(rows, ref, "loss") <= TOL,
                      f"{name}: losses and step 1's Adam moments, every element, within 1e-5 of "
                      f"1x1x1 ({differ or 'all'})")
                differ = checkpoints_differ(f"{ck}/step_000010", stage2)
                check(differ is None, f"{name}: step 10's checkpoint bitwise that of zero 2, 1f1b "
                                      f"({differ or 'all'})")
                calls = {r["dp_all_gather_calls"] for r in rows}
                check(calls == {expect_calls[reshard]},
                      f"{name}: rank 0's all-gathers per step {calls}, expected "
                      f"{expect_calls[reshard]}")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
