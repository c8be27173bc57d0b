# Checks Trident's reading of Hugging Face tokenizer.json files (data/hf_tokenizer.h) against the
# tokenizers library itself: its official Node binding (the npm package `tokenizers`, fetched by
# scripts/fetch_hf_tokenizers.sh), run by node through tests/tools/hf_encode.js. Trident's ids
# come from the trident_tokenize_ids tool (--json) and from `trident tokenize`.
#   gpt2.json    GPT-2's tokenizer as the library builds it from encoder.json and vocab.bpe
#                (ByteLevel pre-tokenizer, <|endoftext|> special, merges as pairs)
#   llama3.json  Llama 3's form, written here: GPT-2's vocabulary and merges ("a b" strings)
#                plus tokens no merge makes, Llama 3's Split expression then ByteLevel,
#                ignore_merges, special tokens after the vocabulary (two non-special, normalized),
#                TemplateProcessing that puts <|begin_of_text|> first
#   qwen2.json   the same with Qwen2's expression (digits one by one)
# Checks: every file equals the library on the tricky strings of test_tokenizer_js.py and more
# (digit runs, CRLF, upper-case contractions, scripts, emoji, special tokens written out) and
# on 3000 random strings; gpt2.json on the King James Bible too, where it also equals Trident's
# GPT-2 tokenizer, as on the tricky strings (all but those where the two reference
# engines differ: the special token, and U+FEFF / U+0085, whitespace in JavaScript and in
# Unicode respectively); `trident tokenize --tokenizer llama3.json` writes, per document, the
# library's ids with special tokens, then <|end_of_text|>, also when it cuts 600 KB of the
# Bible into chunks for several threads.
#
# Run by ctest as: /usr/bin/python3 test_tokenizer_json.py --trident BIN --tools-dir DIR
# Exit status: 0 all checks passed, 1 a check failed, 77 skipped (node, the GPT-2 files or the
# library missing and not fetchable).

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tokenizer_js import (TRICKY, bytes_to_unicode, check, failures,  # noqa: E402
                               random_strings, run)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JS_DRIVER = os.path.join(ROOT, "tests", "tools", "hf_encode.js")
LIB_DIR = os.path.join(ROOT, "data", "hf_tokenizers")

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| "
                r"?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")

MORE_TRICKY = [
    # digit runs: Llama 3 takes three at a time, Qwen2 one
    "1", "12", "123", "1234", "1234567890", "x12345y", " 2024-11-24", "٣٤٥٦", "1,234,567.89",
    # CR and LF, alone and in runs, after spaces and punctuation
    "a\r\nb", "a\r\n\r\nb", "a \r\n b", "!!\r\n", "end.\n\nNext", "\r", "\r\r\n\n", "x\n \ny",
    "  \n  \n", "\t\n\t", "a\u0085b\n",
    # contractions in upper and mixed case, and after other characters
    "I'M HERE", "DON'T", "WE'LL", "THEY'RE", "YOU'VE", "HE'D", "'S'T'RE", "It'S", "x'Ll",
    "'ſ", "'ſa", "'ſt", "'\u212a", "'\u212aa",
    # letters led by one non-letter
    "!hello", "(word)", "\tword", "\u00a0word", "#tag", "1word", "word1",
    # scripts and emoji
    "Привет, мир!", "你好，世界", "こんにちは世界", "안녕하세요", "नमस्ते दुनिया", "שלום עולם",
    "😀😃😄", "👩🏽‍💻 codes", "🇯🇵🇫🇷",
    # the added tokens written out, alone, together and inside words
    "<|begin_of_text|>", "<|end_of_text|>", "a<|end_of_text|>b<|begin_of_text|>",
    "<|begin_of_text|><|begin_of_text|>", "<|end_of_text", "<|end_of", "a<|end", "a<|end_of",
    "<tool>x</tool>", "<tool><tool>",
    "<|reserved_special_token_0|>\n", "<|endoftext|>",
    # whole pieces that only ignore_merges makes one token
    " Supercalifragilistic", "Supercalifragilistic", " Supercalifragilisticexpialidocious", "999",
]


def unicode_of_bytes(text):
    mapping = bytes_to_unicode()
    return "".join(mapping[b] for b in text.encode("utf-8"))


def write_llama_style(path, gpt2_json, regex):
    """A Llama-3-style tokenizer.json on GPT-2's vocabulary (see the file comment)."""
    with open(gpt2_json, encoding="utf-8") as f:
        gpt2 = json.load(f)
    vocab = {k: v for k, v in gpt2["model"]["vocab"].items() if k != "<|endoftext|>"}
    vocab["<|endoftext|>"] = 50256  # an ordinary vocabulary token here, as in Llama 3's
    # Whole pieces for ignore_merges; "'ſa" is one only where (?i:'s) fails to take "'ſ".
    for word in [" Supercalifragilistic", "Supercalifragilistic", "999", "'ſa"]:
        if unicode_of_bytes(word) not in vocab:
            vocab[unicode_of_bytes(word)] = len(vocab)
    merges = [" ".join(pair) for pair in gpt2["model"]["merges"]]
    # "<|end_of" is a prefix of another special token (the longer wins); the normalized
    # "a<|end" starts before "<|end_of_text|>" but is looked for after it.
    added = ["<|begin_of_text|>", "<|end_of", "<|end_of_text|>", "<|reserved_special_token_0|>\n",
             "<tool>", "a<|end"]
    plain = ("<tool>", "a<|end")
    added_tokens = [{"id": len(vocab) + i, "content": c, "single_word": False, "lstrip": False,
                     "rstrip": False, "normalized": c in plain, "special": c not in plain}
                    for i, c in enumerate(added)]
    bos = {"id": "<|begin_of_text|>", "type_id": 0}
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": bos}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                      "ids": [len(vocab)],
                                                      "tokens": ["<|begin_of_text|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False)
    return len(vocab) + added.index("<|end_of_text|>")


def first_difference(ours, theirs):
    if ours == theirs:
        return ""
    i = next((k for k in range(min(len(ours), len(theirs))) if ours[k] != theirs[k]),
             min(len(ours), len(theirs)))
    return (f"first difference at id {i} of {len(ours)} vs {len(theirs)}: "
            f"ours {ours[max(0, i - 3):i + 4]}, library {theirs[max(0, i - 3):i + 4]}")


def ours_strings(tool, tok_json, path):
    return [json.loads(line) for line in run([tool, "--json", tok_json, "--strings", path])
            .splitlines()]


def library(tok_json, mode, path, special=False):
    out = run(["node", JS_DRIVER, os.path.join(LIB_DIR, "package"), tok_json, mode, path] +
              (["--special"] if special else []))
    return [json.loads(line) for line in out.splitlines()]


def compare_strings(name, strings, tool, tok_json, tmp, theirs=None):
    path = os.path.join(tmp, "strings.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(strings, f)
    ours = ours_strings(tool, tok_json, path)
    theirs = theirs(path) if theirs else library(tok_json, "--strings", path)
    bad = [(s, first_difference(o, t)) for s, o, t in zip(strings, ours, theirs) if o != t]
    if len(ours) != len(strings) or len(theirs) != len(strings):
        bad.append(("", f"expected {len(strings)} results, got {len(ours)} and {len(theirs)}"))
    check(name, not bad, f"{len(strings)} strings, {sum(map(len, ours))} ids, all equal"
          if not bad else f"{len(bad)} of {len(strings)} differ; first {bad[0][0]!r}: {bad[0][1]}")


def read_shard(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        return list(struct.unpack(f"<{header[2]}H", f.read(2 * header[2])))


def check_tokenize_command(trident, llama, eot, kjv, tmp):
    """`trident tokenize`: <|begin_of_text|>, the text's ids, <|end_of_text|> per document."""
    docs = ["In the beginning God created the heaven and the earth.\n", "It's 2024!\r\nDON'T"]
    text_path = os.path.join(tmp, "docs.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write("\x1e".join(docs))
    out = os.path.join(tmp, "docs.bin")
    run([trident, "tokenize", text_path, "-o", out, "--tokenizer", llama, "--split-on", "\x1e"])
    expected = []
    for i, doc in enumerate(docs):
        doc_path = os.path.join(tmp, f"doc{i}.txt")
        with open(doc_path, "w", encoding="utf-8") as f:
            f.write(doc)
        expected += library(llama, "--ids", doc_path, special=True)[0] + [eot]
    got = read_shard(out)
    check("tokenize: documents", got == expected, first_difference(got, expected) or
          f"{len(docs)} documents, {len(got)} ids: the library's with special tokens, then "
          f"<|end_of_text|> ({eot})")
    # Genesis to about Judges (600 KB): cut into chunks of 64 KiB, the smallest tokenize makes.
    with open(kjv, "rb") as f:
        part = f.read(600_000)
    part_path = os.path.join(tmp, "kjv-part.txt")
    with open(part_path, "wb") as f:
        f.write(part[:part.rindex(b"\n") + 1])
    out = os.path.join(tmp, "kjv.bin")
    run([trident, "tokenize", part_path, "-o", out, "--tokenizer", llama, "--threads", "2"])
    got = read_shard(out)
    expected = library(llama, "--ids", part_path, special=True)[0] + [eot]
    check("tokenize: the Bible in chunks", got == expected, first_difference(got, expected) or
          f"{len(got)} ids equal on 2 threads")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    args = parser.parse_args()

    gpt2_dir = os.environ.get("TRIDENT_TOKENIZER_DIR") or os.path.join(ROOT, "data", "gpt2")
    if not os.path.isfile(os.path.join(gpt2_dir, "vocab.bpe")):
        print(f"SKIP: GPT-2's files missing in {gpt2_dir}; run scripts/fetch_gpt2_tokenizer.sh")
        return 77
    if not shutil.which("node") or not shutil.which("bible"):
        print("SKIP: node (Debian's nodejs) and bible (bible-kjv) are needed")
        return 77
    fetch = subprocess.run([os.path.join(ROOT, "scripts", "fetch_hf_tokenizers.sh")])
    if fetch.returncode != 0:
        print("SKIP: the tokenizers library could not be fetched")
        return 77
    tool = os.path.join(args.tools_dir, "trident_tokenize_ids")

    with tempfile.TemporaryDirectory() as tmp:
        gpt2 = os.path.join(tmp, "gpt2.json")
        run(["node", JS_DRIVER, os.path.join(LIB_DIR, "package"), gpt2, "--make-gpt2", gpt2_dir])
        llama, qwen = os.path.join(tmp, "llama3.json"), os.path.join(tmp, "qwen2.json")
        eot = write_llama_style(llama, gpt2, LLAMA3_REGEX)
        write_llama_style(qwen, gpt2, QWEN2_REGEX)
        kjv = os.path.join(tmp, "kjv.txt")
        with open(kjv, "wb") as f:
            f.write(subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"],
                                   capture_output=True, check=True).stdout)

        strings = TRICKY + MORE_TRICKY
        randoms = random_strings(3000, seed=2025)
        for name, tok in [("gpt2.json", gpt2), ("llama3.json", llama), ("qwen2.json", qwen)]:
            compare_strings(f"{name}: tricky strings", strings, tool, tok, tmp)
            compare_strings(f"{name}: random strings", randoms, tool, tok, tmp)
        # The Bible through gpt2.json here, through llama3.json in check_tokenize_command.
        ours = json.loads(run([tool, "--json", gpt2, kjv]))  # also checks the round trip
        theirs = library(gpt2, "--ids", kjv)[0]
        check("gpt2.json: the Bible", ours == theirs, first_difference(ours, theirs) or
              f"{len(ours)} ids equal, decode gives the text back")
        gpt2_ids = json.loads(run([tool, "--dir", gpt2_dir, kjv]))
        check("gpt2.json: the Bible as GPT-2's tokenizer", ours == gpt2_ids,
              first_difference(ours, gpt2_ids) or f"{len(ours)} ids equal")
        same_in_both = [s for s in strings if not any(c in s for c in "\ufeff\u0085<")]
        compare_strings("gpt2.json: tricky strings as GPT-2's tokenizer", same_in_both, tool,
                        gpt2, tmp, theirs=lambda path: [json.loads(line) for line in run(
                            [tool, "--dir", gpt2_dir, "--strings", path]).splitlines()])
        check_tokenize_command(args.trident, llama, eot, kjv, tmp)

    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print("all tokenizer.json checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
