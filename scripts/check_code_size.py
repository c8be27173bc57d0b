#!/usr/bin/env python3
"""Code size limits (docs/ARCHITECTURE.md, "Code size"): no function over 80 lines and no file
over 600 in src/, model/, kernels/ and data/, except the table-like functions listed below,
each with the reason it stays whole. Prints every breach and exits 1 if there is one.

Functions are found by their braces: a '{' that ends a line opening a block whose text before
it has a parameter list and is not a class, struct, namespace, enum, lambda or control
statement; its length is counted from the line of its name to its closing brace."""
import os
import re
import sys

ROOTS = ["src", "model", "kernels", "data"]
SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
MAX_FUNCTION, MAX_FILE = 80, 600
# file:function -> why it is allowed to be longer.
TABLES = {
    "src/config/schema.cpp:table": "the key table: one row per config key",
}

CONTROL = re.compile(r"^\s*(if|else|for|while|switch|do|try|catch)\b|\)\s*->|\[[^\]]*\]\s*\(")
NOT_FUNCTION = re.compile(r"\b(class|struct|namespace|enum|union)\b")


def strip(line, state):
    """The line without comments and string contents; state carries an open /* */."""
    out, i = [], 0
    while i < len(line):
        if state["comment"]:
            j = line.find("*/", i)
            if j < 0:
                return "".join(out)
            state["comment"], i = False, j + 2
            continue
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["comment"], i = True, i + 2
            continue
        c = line[i]
        if c in "\"'":
            j = i + 1
            while j < len(line) and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def functions(path):
    """(name, first line, length) of each function defined in the file."""
    state, stack, found, header = {"comment": False}, [], [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    for number, raw in enumerate(lines, 1):
        code = strip(raw, state)
        if not code.strip() or code.lstrip().startswith("#"):
            continue
        header.append((number, code))
        for c in code:
            if c == "{":
                text = " ".join(t for _, t in header)
                is_function = ("(" in text and not NOT_FUNCTION.search(text.split("(")[0])
                               and not CONTROL.search(text.strip())
                               and all(kind != "function" for kind, *_ in stack))
                name = re.findall(r"([~\w:]+)\s*\(", text)
                stack.append(("function" if is_function else "block",
                              header[0][0] if header else number, name[0] if name else "?"))
                header = []
            elif c == "}":
                if stack:
                    kind, start, name = stack.pop()
                    if kind == "function":
                        found.append((name, start, number - start + 1))
                header = []
            elif c == ";":
                header = []
    return found, len(lines)


def main():
    breaches = []
    for root in ROOTS:
        for directory, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                found, total = functions(path)
                if total > MAX_FILE:
                    breaches.append(f"{path}: {total} lines (at most {MAX_FILE} a file)")
                for function, start, length in found:
                    key = f"{path}:{function.split('::')[-1]}"
                    if length > MAX_FUNCTION and key not in TABLES:
                        breaches.append(f"{path}:{start}: {function} is {length} lines "
                                        f"(at most {MAX_FUNCTION} a function)")
    for b in breaches:
        print(b)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
