"""docs/ARCHITECTURE.md cites the code by name: every file path it quotes exists, and every
quoted name that is code (qualified with ::, or written with an underscore or in CamelCase)
is declared in the sources. A renamed class, function or file leaves the page wrong; this
test names what the page cites that is no longer there.

It also holds the code to the page's vocabulary ("Vocabulary"): the grid's degrees have one
spelling each (M the tensor degree, C the context degree: no `tensor_size`, `tp_size`, ...),
and C is only ever the context degree, so the kernels call a row's width `channels` and never
`C` (C++, the C API and extern "C" aside).

Standard library only; the usual --trident and --tools-dir arguments are accepted and unused.
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
CODE_DIRS = ["src", "model", "kernels", "data", "tests", "scripts"]
SUFFIXES = (".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".txt", ".yaml")


def repo_files():
    files = []
    for top in CODE_DIRS + ["docs", "configs"]:
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            files += [os.path.relpath(os.path.join(directory, n), ROOT) for n in names]
    return files + ["CMakeLists.txt", "README.md"]


def code_words(files):
    words = set()
    for f in files:
        if f.endswith(SUFFIXES) and not f.startswith(("docs", "configs")):
            with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as text:
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text.read()))
    return words


def cited(page):
    """The page's quoted pieces: `...` spans."""
    return re.findall(r"`([^`\n]+)`", page)


def is_path(token):
    if "NNN" in token:  # a pattern of names (step_NNNNNN/), not a file
        return False
    return "/" in token and " " not in token and not token.startswith(("-", "$")) or \
        token.endswith((".h", ".cpp", ".cu", ".md", ".py", ".sh"))


def is_code_name(token):
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_:]*(\(\))?", token):
        return False
    bare = token.rstrip("()")
    return "::" in bare or "_" in bare or re.search(r"[a-z][A-Z]", bare) is not None or \
        re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*", bare) is not None


# Other spellings of the grid's degrees, anywhere in the code.
DEGREE_SPELLINGS = re.compile(
    r"\b(tensor|context|tp|cp|dp|pp)_(size|degree|world_size)\b")
# C as a word in the kernels, but for the languages' names (C++, the C API, extern "C").
KERNEL_C = re.compile(r"\bC\b(?!\+\+| API|\")")


def vocabulary_breaches(files):
    """Where the code spells a degree otherwise, or the kernels call channels C."""
    breaches = []
    for f in files:
        if not f.endswith(SUFFIXES) or f.startswith(("docs", "configs")) or \
                f == os.path.relpath(__file__, ROOT):
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as text:
            for number, line in enumerate(text, 1):
                word = DEGREE_SPELLINGS.search(line)
                if word:
                    breaches.append(f"{f}:{number}: {word.group(0)} (the degrees are P, M, C, D)")
                if f.startswith("kernels") and KERNEL_C.search(line):
                    breaches.append(f"{f}:{number}: C in a kernel (C is the context degree; "
                                    "a row's width is `channels`)")
    return breaches


def main():
    files = repo_files()
    by_name = {}
    for f in files:  # files by name, and the folders that hold them ("cpu/")
        by_name.setdefault(os.path.basename(f), []).append(f)
        by_name.setdefault(os.path.basename(os.path.dirname(f)), []).append(f)
    words = code_words(files)
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
        page = f.read()
    missing, checked = [], 0
    for token in sorted(set(cited(page))):
        if is_path(token):
            path = token.rstrip("/").split(" ")[0]
            checked += 1
            if not (os.path.exists(os.path.join(ROOT, path))
                    or os.path.exists(os.path.join(ROOT, "src", path))
                    or os.path.basename(path) in by_name):
                missing.append(f"file {token}")
        elif is_code_name(token):
            checked += 1
            for part in token.rstrip("()").split("::"):
                if part and part not in words:
                    missing.append(f"name {token} ({part} is declared nowhere)")
                    break
    print(f"{checked} names and paths cited by docs/ARCHITECTURE.md checked")
    breaches = vocabulary_breaches(files)
    print(f"{len(files)} files held to the vocabulary: {len(breaches)} breaches")
    missing += [f"vocabulary: {b}" for b in breaches[:40]]
    for m in missing:
        print("FAIL", m)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
