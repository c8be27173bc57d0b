"""Python as a fresh machine's (tests/readme/fresh_machine.py): a module of Debian's
dist-packages that no package of the fresh machine installed (the listing named by
TRIDENT_FRESH_MACHINE_FILES) cannot be imported. On PYTHONPATH, this file takes the place of
Debian's own sitecustomize, which only hooks in apport's crash reports."""
import importlib.abc
import importlib.machinery
import os
import sys

THIRD_PARTY = "/usr/lib/python3/dist-packages/"


class FreshMachine(importlib.abc.MetaPathFinder):
    def __init__(self, files):
        self.files = files

    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        origin = spec.origin if spec else None
        if origin and origin.startswith(THIRD_PARTY) and origin not in self.files \
                and os.path.realpath(origin) not in self.files:
            raise ModuleNotFoundError(f"No module named '{name}' (on this machine, but not on "
                                      f"a fresh one after scripts/run.sh)", name=name)
        return None  # the usual finders go on


listing = os.environ.get("TRIDENT_FRESH_MACHINE_FILES")
if listing:
    with open(listing) as f:
        sys.meta_path.insert(0, FreshMachine(set(f.read().split("\n"))))
