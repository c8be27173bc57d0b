"""`trident tokenize` of JSON-lines corpora against an independent reader: Python's json module
on the same files (gzip's module and the zstd command decompressing them).

Random documents (escapes, control characters, every script and emoji, raw UTF-8 and \\u
escapes, other members of every kind around the text, CRLF endings, blank lines, empty texts)
in .jsonl, .jsonl.gz of two members, .jsonl.zst of two frames and Dolma's .json.gz, one file
large enough to be cut into many blocks:

  1. --tokenizer bytes: the ids are the UTF-8 bytes of the texts Python reads, every element;
  2. GPT-2: the ids are those of the text path on the same documents (Python writes them
     separated by a string none holds, `tokenize --split-on` reads them), every element, with
     one <|endoftext|> after each document;
  3. the shard formats held to their definitions, read here with struct: llm.c's header
     (magic 20240520, version 1, the count; llm.c's dev/data/data_common.py) and size, every
     shard but the last of exactly --shard-tokens; Megatron's .idx (megatron/core/datasets/
     indexed_dataset.py: MMIDIDX, version 1, dtype code 8 for uint16, lengths, pointers back
     to back, a document index of one sequence each); both concatenated are stream 2;
  4. malformed lines: the lines Python's json refuses (or that lack a string "text") are the
     lines trident names, file and line;
  5. memory: about 100 MB of JSON lines (compressed to under 1 MB, 300 MB of ids) tokenized
     in under 100 MiB of resident memory more than a one-line file takes (the binary's own, its
     libraries' and the tokenizer's): what the threads hold, not the corpus.

Run by ctest as: /usr/bin/python3 test_tokenize_jsonl.py --trident BIN --tools-dir DIR
Exit status: 0 passed, 1 failed.
"""
import argparse
import gzip
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEPARATOR = "<<document boundary 7f3a>>"
EOT = 50256

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 4 +
            list(" " * 20) + list(".,;:!?'\"\\/-()[]{}<>|#@&*") + ["\n", "\t", "\r", "\n\n"] +
            ["\x00", "\x01", "\x1f", "\x7f"] + list("éßЖж中文日本語ع٣क्½Ⅻ²") +
            ["\u00a0", "\u2003", "\u2028", "\u2029", "\ufeff", "\u0085", "\u200d", "😀", "👍🏽",
             "\U0001d7d8", "<|endoftext|>"])


def random_text(rng, length):
    return "".join(rng.choice(ALPHABET) for _ in range(length))


def random_line(rng, i):
    """One JSON line's bytes (its newline included) and its text, as json writes them."""
    text = "" if rng.random() < 0.05 else random_text(rng, rng.choice([1, 5, 40, 300, 2000]))
    members = [("text", text), ("id", i), ("score", rng.random()), ("flag", rng.random() < 0.5),
               ("none", None), ("meta", {"url": random_text(rng, 10), "tags": [1, 2.5, "x", []]})]
    rng.shuffle(members)
    spaced = rng.random() < 0.5
    line = json.dumps(dict(members), ensure_ascii=rng.random() < 0.5,
                      separators=(", ", ": ") if spaced else (",", ":"))
    line = " " * rng.randint(0, 2) + line + " " * rng.randint(0, 2)
    ending = "\r\n" if rng.random() < 0.1 else "\n"
    blank = "\n" if rng.random() < 0.03 else ""
    return (line + ending + blank).encode()


# Escapes json.dumps never writes: "\/", upper-case hex, a surrogate pair spelled out.
HANDWRITTEN = (b'{"text": "\\/slash \\u00E9\\u00e9 \\uD83D\\uDE00 \\b\\f", "id": -0.0e+0}\n'
               b'{"id": [], "text": "tab\\there", "x": {"y": {"z": [true, false, null]}}}\n')


def zstd_compress(data):
    return subprocess.run(["zstd", "-q", "-c"], input=data, stdout=subprocess.PIPE,
                          check=True).stdout


def decompress(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        return gzip.decompress(data)  # every member
    if path.endswith(".zst"):
        return subprocess.run(["zstd", "-q", "-d", "-c"], input=data, stdout=subprocess.PIPE,
                              check=True).stdout
    return data


def python_documents(paths):
    """The non-empty texts of the files' lines, in order; and (path, line) of those refused."""
    docs, refused = [], []
    for path in paths:
        for number, line in enumerate(decompress(path).split(b"\n"), 1):
            if not line.strip(b" \t\r"):
                continue
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                refused.append((path, number))
                continue
            if text:
                docs.append(text)
    return docs, refused


def write_corpus(tmp, rng):
    """The files of the comparison, in the order given to trident."""
    def lines(n, start):
        return b"".join(random_line(rng, start + i) for i in range(n))

    paths = []

    def put(name, data):
        paths.append(os.path.join(tmp, name))
        with open(paths[-1], "wb") as f:
            f.write(data)

    put("a.jsonl", HANDWRITTEN + lines(300, 0))
    put("b.jsonl.gz", gzip.compress(lines(200, 1000)) + gzip.compress(lines(100, 2000)))
    put("c.jsonl.zst", zstd_compress(lines(200, 3000)) + zstd_compress(lines(50, 4000)))
    put("d.json.gz", gzip.compress(lines(100, 5000).replace(b"\r\n", b"\n")))
    put("e.jsonl.zst", zstd_compress(lines(3000, 6000)))  # about 2 MB: several blocks
    return paths


def trident(binary, args):
    p = subprocess.run([binary, "tokenize", "--no-progress"] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True,
                       env=dict(os.environ, TRIDENT_TOKENIZER_DIR=os.path.join(ROOT, "data", "gpt2")))
    if p.returncode != 0:
        print(p.stdout)
    return p


def llmc_shard(path):
    """The tokens of an llm.c shard, or None where its header or size is not llm.c's."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    if header[0] != 20240520 or header[1] != 1 or len(data) != 1024 + 2 * header[2]:
        print(f"     {path}: header {header[:3]}, {len(data)} bytes")
        return None
    return list(struct.unpack(f"<{header[2]}H", data[1024:]))


def megatron_dataset(prefix):
    """[documents' tokens] of a Megatron pair, or None where its index is not Megatron's."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        tokens = f.read()
    magic, version, code, n, d = struct.unpack("<9sQBQQ", idx[:34])
    lengths = struct.unpack(f"<{n}i", idx[34:34 + 4 * n])
    pointers = struct.unpack(f"<{n}q", idx[34 + 4 * n:34 + 12 * n])
    docs = struct.unpack(f"<{d}q", idx[34 + 12 * n:34 + 12 * n + 8 * d])
    back_to_back = all(pointers[i] == 2 * sum(lengths[:i]) for i in range(n))
    if not (magic == b"MMIDIDX\x00\x00" and version == 1 and code == 8 and d == n + 1 and
            len(idx) == 34 + 12 * n + 8 * d and back_to_back and list(docs) == list(range(n + 1))
            and len(tokens) == 2 * sum(lengths)):
        print(f"     {prefix}.idx: {magic}, version {version}, code {code}, {n} sequences")
        return None
    ids = struct.unpack(f"<{len(tokens) // 2}H", tokens)
    out, at = [], 0
    for length in lengths:
        out.append(list(ids[at:at + length]))
        at += length
    return out


def check_formats(binary, tmp, paths, stream):
    out = os.path.join(tmp, "shard.bin")
    check(trident(binary, ["--shard-tokens", "4096", "--output", out] + paths).returncode == 0,
          "llm.c shards of 4096 tokens written")
    shards = sorted(f for f in os.listdir(tmp) if f.startswith("shard_"))
    tokens = [llmc_shard(os.path.join(tmp, f)) for f in shards]
    check(None not in tokens, f"{len(shards)} llm.c shards: each header (magic 20240520, "
                              f"version 1, its count) and size as llm.c defines them")
    tokens = [t or [] for t in tokens]
    check(all(len(t) == 4096 for t in tokens[:-1]) and 0 < len(tokens[-1]) <= 4096,
          f"{len(shards)} llm.c shards: every one but the last of exactly 4096 tokens")
    check(sum(tokens, []) == stream, "the llm.c shards concatenated are the one output's stream")

    prefix = os.path.join(tmp, "meg")
    check(trident(binary, ["--format", "megatron", "--shard-tokens", "4096", "--output", prefix]
                  + paths).returncode == 0, "Megatron shards of at most 4096 tokens written")
    shards = []
    while os.path.exists(f"{prefix}_{len(shards):06d}.idx"):
        shards.append(megatron_dataset(f"{prefix}_{len(shards):06d}"))
    check(shards and None not in shards,
          f"{len(shards)} Megatron shards: each index as Megatron defines it (MMIDIDX, version 1, "
          f"uint16, sequences back to back, one document each)")
    shards = [s or [] for s in shards]
    check(all(sum(map(len, s)) <= 4096 or len(s) == 1 for s in shards),
          "every Megatron shard of whole documents within 4096 tokens")
    documents = sum(shards, [])
    check(all(doc and doc[-1] == EOT and EOT not in doc[:-1] for doc in documents),
          f"every Megatron document ends in <|endoftext|>, and only there ({len(documents)})")
    check(sum(documents, []) == stream, "the Megatron shards concatenated are the one stream")


def check_malformed(binary, tmp):
    good = [b'{"text": "fine"}', b'{"text": "also fine", "n": 1}']
    bad = [b'{"text": "cut short', b'{"text": "a",}', b"{'text': 'single quotes'}",
           b'{"txt": "no text key"}', b'{"text": 5}', b'{"text": "\xff invalid UTF-8"}',
           b'{"text": "raw \x01 control"}', b'["text", "an array"]', b'{"text": "a"} trailing',
           b'{"text": "a" "b": 1}']
    rng = random.Random(5)
    lines = good * 5 + bad
    rng.shuffle(lines)
    path = os.path.join(tmp, "bad.jsonl")
    with open(path, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    docs, refused = python_documents([path])
    p = trident(binary, ["--tokenizer", "bytes", "--max-bad-lines", "10", "--output",
                         os.path.join(tmp, "bad.bin"), path])
    warning = f"trident: warning: {path}:"
    named = sorted(int(line[len(warning):].split(":")[0]) for line in p.stdout.splitlines()
                   if line.startswith(warning))
    check(p.returncode == 0 and named == sorted(n for _, n in refused) and len(refused) == 10,
          f"the malformed lines trident names are those json refuses: {named}")
    check(llmc_shard(os.path.join(tmp, "bad.bin")) == list("".join(docs).encode()),
          "the well-formed lines around them tokenized")
    p = trident(binary, ["--tokenizer", "bytes", "--max-bad-lines", "9", "--output",
                         os.path.join(tmp, "bad9.bin"), path])
    last = f"{path}:{max(n for _, n in refused)}: "
    check(p.returncode == 1 and last in p.stdout and "more than --max-bad-lines 9" in p.stdout
          and not os.path.exists(os.path.join(tmp, "bad9.bin")),
          "one line more than --max-bad-lines stops at it, writing nothing")


def check_memory(binary, tmp):
    path = os.path.join(tmp, "large.jsonl.zst")
    rng = random.Random(9)
    paragraphs = [random_text(rng, 1000) * 4 for _ in range(50)]
    texts = [paragraphs[i % 50] for i in range(16000)]
    lines = b"".join(json.dumps({"text": t, "id": i}).encode() + b"\n" for i, t in enumerate(texts))
    with open(path, "wb") as f:
        f.write(zstd_compress(lines))
    small = os.path.join(tmp, "small.jsonl")
    with open(small, "w") as f:
        f.write('{"text": "one line"}\n')

    def resident(corpus, out):
        """The peak resident MiB of tokenizing `corpus`, in a process of its own."""
        measure = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
                   "stdout=subprocess.DEVNULL); "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
        p = subprocess.run([sys.executable, "-c", measure, binary, "tokenize", "--no-progress",
                            "--tokenizer", "bytes", "--threads", "2", "--output", out, corpus],
                           stdout=subprocess.PIPE, text=True)
        return int(p.stdout.strip()) / 1024 if p.returncode == 0 else float("inf")

    base = resident(small, os.path.join(tmp, "small.bin"))
    out = os.path.join(tmp, "large.bin")
    rss = resident(path, out)
    tokens = sum(len(t.encode()) for t in texts)
    written = os.path.getsize(out) if os.path.exists(out) else 0
    check(written == 1024 + 2 * tokens and rss - base < 100,
          f"{len(lines) / 1e6:.0f} MB of JSON lines ({os.path.getsize(path) / 1e6:.1f} MB "
          f"compressed, {tokens} tokens written) tokenized in {rss:.0f} MiB resident, "
          f"{rss - base:.0f} more than one line's (under 100)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trident", required=True)
    p.add_argument("--tools-dir")
    a = p.parse_args()
    rng = random.Random(1234)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_corpus(tmp, rng)
        docs, refused = python_documents(paths)
        check(not refused and len(docs) > 3500, f"Python reads {len(docs)} documents, refusing none")

        out = os.path.join(tmp, "bytes.bin")
        check(trident(a.trident, ["--tokenizer", "bytes", "--output", out] + paths).returncode == 0,
              "bytes: tokenized")
        expected = list("".join(docs).encode())
        check(llmc_shard(out) == expected,
              f"bytes: the ids are the UTF-8 bytes of Python's texts, all {len(expected)}")

        jsonl = os.path.join(tmp, "gpt2.bin")
        check(trident(a.trident, ["--output", jsonl] + paths).returncode == 0, "GPT-2: tokenized")
        text = os.path.join(tmp, "docs.txt")
        check(all(SEPARATOR not in d for d in docs), "no document holds the separator")
        with open(text, "w", encoding="utf-8", newline="") as f:
            f.write(SEPARATOR.join(docs))
        reference = os.path.join(tmp, "text.bin")
        check(trident(a.trident, ["--split-on", SEPARATOR, "--output", reference, text])
              .returncode == 0, "GPT-2: the text path on Python's documents")
        stream = llmc_shard(jsonl)
        check(stream == llmc_shard(reference) and len(stream) > 100000,
              f"GPT-2: the ids are the text path's on the same documents, all {len(stream)}")
        check(stream.count(EOT) == len(docs) and stream[-1] == EOT,
              f"GPT-2: one <|endoftext|> after each of the {len(docs)} documents")

        check_formats(a.trident, tmp, paths, stream)
        check_malformed(a.trident, tmp)
        check_memory(a.trident, tmp)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
