"""A worker that cannot start, as on a GPU that is gone (its adapter no longer listed):
a test sets one Worker's `child` to "gone" (tests/faulty on PYTHONPATH: faults.plant),
kills its process, and the worker cannot be restarted."""

import sys


def main(argv: list[str]) -> int:
    print("NoAdapterError: this GPU is gone", file=sys.stderr)
    return 1
