#!/usr/bin/python3
"""Writes the King James Bible (Debian's bible-kjv) as a JSON-lines corpus shaped as FineWeb's
exports: one document a chapter, {"text": its verses one a line, "id": "kjv/Ge/1", "url":
"urn:kjv:Ge.1"}. Genesis to Jude go to train_000.jsonl ... over --train-files files (about equal
in chapters), Revelation to valid.jsonl; --compress zst (the zstd command) or gz (gzip) then
compresses each, as FineWeb-Edu, the Pile and Dolma are shipped. With --text the training
chapters are also written as train.txt, separated by a blank line, for the plain-text path's
`trident tokenize --split-on '\\n\\n'`: the same documents, so the same ids. --copies N repeats
the training chapters N times (a benchmark's larger input).

Usage: scripts/kjv_jsonl.py OUT_DIR [--train-files N] [--compress none|zst|gz] [--text]
                            [--copies N]
README's "GPT-2 124M on FineWeb-Edu" tries its commands on this corpus; scripts/bench_tokenize.sh
measures the JSON-lines path on it. Standard library only (and the zstd command for zst).
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys

VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def chapters(first, last):
    """[(book, chapter, text)] of the verses from `first` to `last` ("Genesis 1:1")."""
    out = subprocess.run(["bible", "-f", f"{first}-{last}"], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        m = VERSE.match(line)
        if not m:
            raise SystemExit(f"kjv_jsonl: not a verse of bible's output: {line!r}")
        book, chapter, text = m.group(1), int(m.group(2)), m.group(4)
        if found and found[-1][:2] == (book, chapter):
            found[-1] = (book, chapter, found[-1][2] + "\n" + text)
        else:
            found.append((book, chapter, text))
    return found


def write(path, docs, compress):
    lines = "".join(json.dumps({"text": text, "id": f"kjv/{book}/{chapter}",
                                "url": f"urn:kjv:{book}.{chapter}"}, ensure_ascii=False) + "\n"
                    for book, chapter, text in docs).encode()
    if compress == "gz":
        with gzip.open(path + ".gz", "wb") as f:
            f.write(lines)
        return path + ".gz"
    with open(path, "wb") as f:
        f.write(lines)
    if compress == "zst":
        subprocess.run(["zstd", "-q", "-f", "--rm", path, "-o", path + ".zst"], check=True)
        return path + ".zst"
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--train-files", type=int, default=4)
    p.add_argument("--compress", choices=["none", "zst", "gz"], default="none")
    p.add_argument("--text", action="store_true")
    p.add_argument("--copies", type=int, default=1)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    train = chapters("Genesis 1:1", "Jude 1:25") * a.copies
    per_file = -(-len(train) // a.train_files)
    written = [write(os.path.join(a.out, f"train_{i:03d}.jsonl"),
                     train[i * per_file:(i + 1) * per_file], a.compress)
               for i in range(a.train_files)]
    written.append(write(os.path.join(a.out, "valid.jsonl"),
                         chapters("Revelation 1:1", "Revelation 22:21"), a.compress))
    if a.text:
        with open(os.path.join(a.out, "train.txt"), "w") as f:
            f.write("\n\n".join(text for _, _, text in train))
        written.append(os.path.join(a.out, "train.txt"))
    print(f"kjv_jsonl: {len(train)} training chapters in {a.train_files} files and 22 "
          f"validation chapters: {' '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
