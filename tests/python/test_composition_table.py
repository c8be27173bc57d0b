"""scripts/composition_table.py's legend on made-up results: a table with no refusal says
nothing of refusals (no "refused at start-up:" with nothing after it); a table with one keys
the ✗ and lists the refusal, with its id from docs/ARCHITECTURE.md, below the legend.

Run by ctest as: /usr/bin/python3 test_composition_table.py --trident BIN --tools-dir DIR
(neither is used). Standard library only.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import composition_table  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def results(refused):
    """Two features; their pairing refused with `refused` as the message, or equal."""
    features = [{"id": "a", "label": "A"}, {"id": "b", "label": "B"}]
    pair = {"status": "refused", "message": refused} if refused else {"status": "equal"}
    cells = {"a|a": {"status": "equal"}, "b|b": {"status": "equal"}, "a|b": pair}
    return {"features": features, "cells": cells, "all_two": {"status": "equal"}}


ARCHITECTURE = """### Refusals in the composition table

- **x-y** (`parallel\\.x with y`): why.

## Next
"""


def main():
    clean = composition_table.render(results(None), ARCHITECTURE).split("\n")
    legend = next(line for line in clean if line.startswith("✓ equal"))
    check(legend.endswith("nb not built yet.") and "refused" not in legend,
          f"no refusal: the legend ends with its last key ({legend[-40:]!r})")
    check(not any(line.rstrip().endswith(":") for line in clean),
          "no refusal: no line ends in a colon with nothing after it")
    at = clean.index(legend)
    check(clean[at + 1] == "" and clean[at + 2].startswith("P = M = C = D = 2"),
          "no refusal: one blank line between the legend and the 16-rank run")

    refused = composition_table.render(results("parallel.x with y is not built"),
                                       ARCHITECTURE).split("\n")
    legend = next(line for line in refused if line.startswith("✓ equal"))
    check(legend.endswith("✗ refused at start-up, for the reason listed below."),
          "a refusal: the legend keys the ✗")
    check("- **x-y**: parallel.x with y is not built ([why](docs/ARCHITECTURE.md#refusals-in-"
          "the-composition-table))" in refused, "a refusal: listed below the legend by its id")
    check("| 1 A | ✓ | ✗ x-y |" in refused, "a refusal: its cell names its id")
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
