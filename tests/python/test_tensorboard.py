"""TensorBoard event files (logging.tensorboard) read back with a real protocol-buffer library:
Debian's python3-protobuf with the Event and Summary messages of TensorBoard's event.proto and
summary.proto (tests/python/tensorboard/, the published field numbers) compiled by protoc, and
the TFRecord framing's masked CRC32C checked with Debian's python3-crc32c. Not with Trident's
own writer.

A 1x1x2 run of 6 steps with validation every 3: rank 0 alone writes one event file; its first
record is the file version, then one summary per step whose scalars are the metrics file's
figures (as float32), the validation loss at steps 3 and 6; a failing disk is one clear line.
Exit 77 (skipped, with the reason) where mpirun, protoc or the Python modules are missing.
"""
import glob
import importlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import mpi_harness as h

PROTO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tensorboard")

# Each TensorBoard tag and the metrics file's key it carries.
TAGS = {"lm loss": "loss", "learning-rate": "lr", "grad-norm": "grad_norm",
        "loss-scale": "loss_scale", "throughput/tokens_per_s": "tokens_per_s",
        "throughput/tflops_per_gpu": "tflops_per_gpu", "throughput/mfu": "mfu",
        "memory/peak_bytes": "mem_peak_bytes", "memory/params_bytes": "mem_params_bytes",
        "memory/grads_bytes": "mem_grads_bytes",
        "memory/optimizer_bytes": "mem_optimizer_bytes",
        "memory/activations_bytes": "mem_activations_bytes",
        "skipped-iterations": "skipped", "skipped-iterations-total": "skipped_total",
        "iteration-time": "step_ms"}
SCALE = {"iteration-time": 1e-3}  # milliseconds in the metrics file, seconds in TensorBoard


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xa282ead8) & 0xFFFFFFFF


def records(path, crc32c):
    """The data of each TFRecord record of the file, both CRCs checked."""
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        head = data[at:at + 8]
        (length,) = struct.unpack("<Q", head)
        (head_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        h.check(head_crc == masked(crc32c(head)), f"record at {at}: the length's masked CRC32C")
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        h.check(len(body) == length and body_crc == masked(crc32c(body)),
                f"record at {at}: {length} bytes and their masked CRC32C")
        out.append(body)
        at += 16 + length
    return out


def as_f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def same_f32(got, want):
    """The metrics file prints 9 digits of the double: its float32 is within one ulp."""
    return got.keys() == want.keys() and all(
        abs(got[k] - want[k]) <= 2.0 ** -23 * abs(want[k]) for k in want)


def compiled_protos(tmp):
    protoc = shutil.which("protoc")
    if protoc is None:
        return None
    subprocess.run([protoc, f"-I{PROTO_DIR}", f"--python_out={tmp}", "event.proto",
                    "summary.proto"], check=True)
    sys.path.insert(0, tmp)
    return importlib.import_module("event_pb2")


def main():
    trident, _ = h.binaries_or_skip()
    try:
        import crc32c
        import google.protobuf  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (Debian's python3-protobuf and python3-crc32c)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        event_pb2 = compiled_protos(tmp)
        if event_pb2 is None:
            print("SKIP: protoc not found (Debian's protobuf-compiler)")
            return 77
        base = h.tiny_run(tmp)
        board = os.path.join(tmp, "board")
        metrics = os.path.join(tmp, "m.jsonl")
        args = [trident, "train"] + base
        for o in ["parallel.data=2", "training.steps=6", "training.eval_interval=3",
                  f"data.valid={base[1].replace('c.yaml', 'train.bin')}",
                  f"logging.metrics={metrics}", f"logging.tensorboard={board}"]:
            args += ["--set", o]
        h.run(args, ranks=2)
        files = glob.glob(os.path.join(board, "*"))
        h.check(len(files) == 1 and "events.out.tfevents." in files[0],
                f"one event file, named as TensorBoard looks for it: {files}")
        events = []
        for body in records(files[0], crc32c.crc32c):
            e = event_pb2.Event()
            e.ParseFromString(body)
            events.append(e)
        h.check(events[0].WhichOneof("what") == "file_version"
                and events[0].file_version == "brain.Event:2",
                f"the first event is the file version: {events[0]}")
        steps = h.losses(metrics)
        summaries = events[1:]
        h.check([e.step for e in summaries] == [r["step"] for r in steps] == list(range(1, 7)),
                f"one summary per step: {[e.step for e in summaries]}")
        for e, r in zip(summaries, steps):
            got = {v.tag: v.simple_value for v in e.summary.value}
            want = {tag: as_f32(r[key] * SCALE.get(tag, 1)) for tag, key in TAGS.items()}
            if "val_loss" in r:
                want["lm loss validation"] = as_f32(r["val_loss"])
            h.check(same_f32(got, want) and e.wall_time > 1.6e9,
                    f"step {e.step}: the scalars are the metrics file's ({len(got)} tags)")
            if not same_f32(got, want):
                print(f"  got  {got}\n  want {want}")
        h.check([e.step for e in summaries if any(v.tag == "lm loss validation"
                                                  for v in e.summary.value)] == [3, 6],
                "the validation loss at steps 3 and 6")

        # A disk that fails the event file: one line, exit code 1.
        env = {**h.mpirun_env(), "TRIDENT_TEST_WRITE_ERROR": "tfevents:ENOSPC"}
        bad = os.path.join(tmp, "bad")
        p = subprocess.run(["mpirun", "--oversubscribe", "-np", "2"] + args[:-1]
                           + [f"logging.tensorboard={bad}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, timeout=300)
        errors = [x for x in p.stdout.splitlines() if x.startswith("trident: error:")]
        h.check(p.returncode == 1 and len(errors) == 1
                and errors[0].startswith(f"trident: error: logging.tensorboard: {bad}/events.out."
                                         "tfevents.")
                and errors[0].endswith("cannot write: No space left on device (ENOSPC)"),
                f"a failing disk: one line, exit code 1 (got {p.returncode}): {errors}")
    if h.failures:
        print(f"{len(h.failures)} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
