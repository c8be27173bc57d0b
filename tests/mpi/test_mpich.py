#!/usr/bin/python3
"""Trident built against MPICH (scripts/build_mpich.sh) and launched with MPICH's mpiexec.

Builds (or brings up to date) build-mpich/, checks that its binary links MPICH alone, then
trains the layout tests' tiny model for 10 steps (dropout 0.1, data shuffled) on 1 process
and, under mpiexec.mpich, on 2 (D = 2, ZeRO-1) and 4 processes (P = 2 x M = 2, 1F1B). Every
run's losses and gradient norms must equal those of one process of the default Open MPI
build within 1e-5 relative, as on Open MPI (tests/python/test_data_parallel.py).

Exit 77 (skipped, with the reason) where MPICH is not installed.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from mpi_harness import check, failures, losses, run, tiny_run  # noqa: E402

# (processes, overrides)
LAYOUTS = [(1, []),
           (2, ["parallel.data=2", "parallel.zero_stage=1"]),
           (4, ["parallel.pipeline=2", "parallel.tensor=2", "parallel.schedule=1f1b"])]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True, help="the default (Open MPI) build's binary")
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True, help="where to build against MPICH")
    a = parser.parse_args()
    for tool in ("mpicxx.mpich", "mpiexec.mpich"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} not found: install Debian's mpich and libmpich-dev"
                  " (scripts/setup.sh --tests does)")
            return 77

    t0 = time.monotonic()
    build = subprocess.run([os.path.join(a.source_dir, "scripts", "build_mpich.sh"),
                            a.build_dir], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=1500)
    print(build.stdout.splitlines()[-1] if build.stdout else "", flush=True)
    check(build.returncode == 0,
          f"scripts/build_mpich.sh {a.build_dir} ({time.monotonic() - t0:.0f} s)")
    if build.returncode != 0:
        print(build.stdout)
        return 1
    mpich_trident = os.path.join(a.build_dir, "trident")

    with tempfile.TemporaryDirectory() as tmp:
        base = tiny_run(tmp, ["model.layers=4", "model.dropout=0.1", "training.global_batch=8",
                              "data.shuffle=true"])
        reference_metrics = os.path.join(tmp, "openmpi1.jsonl")
        run([a.trident, "train"] + base + ["--set", f"logging.metrics={reference_metrics}"])
        reference = losses(reference_metrics)
        for ranks, overrides in LAYOUTS:
            metrics = os.path.join(tmp, f"mpich{ranks}.jsonl")
            args = base + ["--set", f"logging.metrics={metrics}"]
            for o in overrides:
                args += ["--set", o]
            p = subprocess.run([shutil.which("mpiexec.mpich"), "-n", str(ranks), mpich_trident,
                                "train"] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=300)
            name = f"mpiexec.mpich -n {ranks} {' '.join(overrides) or '(one process)'}"
            if p.returncode != 0:
                print(p.stdout)
                check(False, f"{name}: exit status {p.returncode}")
                continue
            rows = losses(metrics)
            worst = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(rows, reference))
            norm = max(abs(x["grad_norm"] - y["grad_norm"]) / abs(y["grad_norm"])
                       for x, y in zip(rows, reference))
            check(len(rows) == len(reference) == 10 and worst <= 1e-5 and norm <= 1e-5,
                  f"{name}: {len(rows)} steps, losses and gradient norms within 1e-5 of one "
                  f"Open MPI process (worst {worst:.2e}, norm {norm:.2e})")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
