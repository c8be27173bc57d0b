#!/usr/bin/python3
"""README's composition table, rendered from the results of tests/python/test_composition.py.

The test writes composition.json beside the trident binary: each feature (id, label), each
pairing's status (equal, one process, refused with its message, n/a, not built; failed or
differs when the test failed) and the P = M = C = D = 2 run. This script renders them as a
features × features table with a footnote per refusal, each keyed by the short id of its entry
in docs/ARCHITECTURE.md ("Refusals in the composition table", `- **id** (`pattern`): why`, the
pattern a regular expression matching the message's start); a refusal without an entry is an
error. The table lives between the markers in README.md.

    scripts/composition_table.py build/composition.json --write   # regenerate README's table
    scripts/composition_table.py build/composition.json --check   # README's table is the render

Standard library only.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = "<!-- composition table: begin -->"
END = "<!-- composition table: end -->"
ENTRY = re.compile(r"^- \*\*([a-z0-9-]+)\*\* \(`([^`]+)`\)", re.M)
SYMBOL = {"equal": "✓", "one process": "1p", "n/a": "n/a", "not built": "nb"}


def refusal_ids(architecture):
    """[(id, pattern)] of the entries in docs/ARCHITECTURE.md."""
    section = architecture.split("### Refusals in the composition table", 1)
    if len(section) < 2:
        raise ValueError("docs/ARCHITECTURE.md has no section 'Refusals in the composition table'")
    return ENTRY.findall(section[1].split("\n## ", 1)[0])


def id_of(message, entries):
    for key, pattern in entries:
        if re.match(pattern, message):
            return key
    raise ValueError(f"refusal without an entry in docs/ARCHITECTURE.md's 'Refusals in the "
                     f"composition table': {message}")


def cell(results, a, b, entries, used):
    c = results["cells"].get(f"{a}|{b}") or results["cells"][f"{b}|{a}"]
    if c["status"] == "refused":
        key = id_of(c["message"], entries)
        used.setdefault(key, c["message"])
        return f"✗ {key}"
    return SYMBOL.get(c["status"], "FAIL")


def render(results, architecture):
    """The markdown between the markers (the markers included)."""
    entries = refusal_ids(architecture)
    ids = [f["id"] for f in results["features"]]
    used = {}
    lines = [BEGIN, "", "| | " + " | ".join(str(i + 1) for i in range(len(ids))) + " |",
             "|---" * (len(ids) + 1) + "|"]
    for i, f in enumerate(results["features"]):
        row = [cell(results, f["id"], b, entries, used) for b in ids]
        lines.append(f"| {i + 1} {f['label']} | " + " | ".join(row) + " |")
    # The refusals' key, and their list, only where the table has one.
    refusals = " · ✗ refused at start-up, for the reason listed below" if used else ""
    lines += ["", "✓ equal to one process after 2 steps: fp32, the checkpoint (weights, master "
              "weights, Adam's moments, Muon's momentum) every element within 1e-5 of its "
              "tensor's largest; bf16 "
              "and fp16, each loss within 2% and every element within 10% (the reasons: "
              "tests/python/test_composition.py) · 1p one process (no "
              "grid: its own reference) · n/a the two set one key to two values · nb not built "
              "yet" + refusals + "."]
    if used:
        lines.append("")
    for key in sorted(used):
        lines.append(f"- **{key}**: {used[key]} ([why](docs/ARCHITECTURE.md#refusals-in-the-"
                     f"composition-table))")
    # The run's time stays in the results: the table changes only when a result does.
    everything = results["all_two"]["status"]
    lines += ["", f"P = M = C = D = 2 (16 ranks: 1F1B, sequence parallelism, ring, ZeRO-1): "
                  f"{SYMBOL.get(everything, 'FAIL')}.", "", END]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite README.md's table")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 unless README.md's table is the render")
    a = p.parse_args()
    if not os.path.exists(a.results):
        print(f"{a.results}: no results; run tests/python/test_composition.py first "
              f"(ctest -R python.test_composition)")
        return 1
    with open(a.results) as f:
        results = json.load(f)
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md")) as f:
        try:
            table = render(results, f.read())
        except ValueError as e:
            print(e)
            return 1
    readme_path = os.path.join(ROOT, "README.md")
    with open(readme_path) as f:
        readme = f.read()
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise SystemExit(f"README.md: needs one '{BEGIN}' and one '{END}'")
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    if a.write:
        with open(readme_path, "w") as f:
            f.write(readme[:start] + table + readme[end:])
        return 0
    if readme[start:end] != table:
        old, new = readme[start:end].splitlines(), table.splitlines()
        first = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y),
                     min(len(old), len(new)))
        print(f"README.md's composition table is not what {a.results} renders; first difference "
              f"at its line {first + 1}:\n  README: {old[first] if first < len(old) else '(end)'}"
              f"\n  render: {new[first] if first < len(new) else '(end)'}\n"
              f"regenerate: scripts/composition_table.py {a.results} --write")
        return 1
    print("README.md's composition table is what the results render")
    return 0


if __name__ == "__main__":
    sys.exit(main())
