"""Shape generalisation: how much slower is what lookup serves from other tuned shapes
than tuning the shape itself?

    python benchmarks/regret.py --tuned 1024x1024x1024 --tuned 4096x4096x4096 \
        --held 2048x2048x2048 --held 1536x4096x1024 --timeout 30 --out regret.json

The --tuned shapes are tuned into a fresh cache; each --held shape (never tuned with the
others) is then served by `lookup`'s fallback from that cache alone (the configs ranked
by predicted time, the best few timed at the shape: `estimated`), and tuned itself into
another fresh cache; both kernels are timed back to back on the same data.
Regret = time of the served kernel / time of the kernel tuned for the shape - 1.

    python benchmarks/regret.py --leave-one-out cache/ --out regret.json

uses tuned entries already in a cache folder instead (no tuning): each plain f32 shape
tuned there is held out in turn, served from the others, and timed against its own entry.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import autotune
from autotune import cache
from autotune.device import versions
from autotune.kernel import Kernel
from autotune.lookup import ESTIMATE_S, _estimate
from autotune.measure import measure
from autotune.problem import parse_shape, shape_distance
from autotune.verify import Reference


def time_pair(problem, near, mine, gpu) -> dict:
    """Both kernels timed back to back on the same data, twice: the faster round of each."""
    reference = Reference(problem, seed=0)
    operands = (reference.A, reference.B)
    seconds = {}
    for _ in range(2):
        for name, kernel in (("nearest", near), ("tuned", mine)):
            m = measure(kernel.compiled, gpu, operands=operands)
            seconds[name] = min(seconds.get(name, m.median_s), m.median_s)
    near_shape = near.entry.key.problem if near.entry else None
    row = {
        "shape": problem.shape,
        "nearest_source": near.source,
        "nearest_tuned_for": near_shape.shape if near_shape else None,
        "distance": shape_distance(near_shape, problem) if near_shape else None,
        "nearest_config": str(near.config),
        "tuned_config": str(mine.config),
        "nearest_s": seconds["nearest"],
        "tuned_s": seconds["tuned"],
        "regret": seconds["nearest"] / seconds["tuned"] - 1,
    }
    print(
        f"{problem.shape:>18}: nearest ({near.source}, {row['nearest_tuned_for']}) "
        f"{seconds['nearest'] * 1e3:.3f} ms, tuned {seconds['tuned'] * 1e3:.3f} ms, "
        f"regret {row['regret']:+.1%}",
        flush=True,
    )
    return row


def nearest(problem, folder, gpu, checks):
    """lookup's fallback for a shape without an entry, from `folder` alone (lookup itself
    would also read the shipped cache/, which may hold the held-out shape). It keeps its
    estimate in `folder`: give each held-out shape a folder of its own."""
    store = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    reference = Reference(problem)
    kernel = _estimate(problem, checks, [store], gpu, gpu.limits, reference, False, ESTIMATE_S)
    if kernel is None:
        raise SystemExit(f"no tuned shape in {folder} computes {problem} correctly")
    return kernel


def tuned_and_held(args, gpu, checks, tuned_dir, own_dir):
    """(problem, nearest kernel, own kernel, tuning seconds) for each held-out shape."""

    def tune(problem, folder):
        return autotune.tune(
            **problem.arguments, templates=["blocked"], trials=None,
            timeout=args.timeout, checks=checks, cache_dir=folder, gpu=gpu,
        )  # fmt: skip

    for shape in args.tuned:
        tune(parse_shape(shape), tuned_dir)
    for shape in args.held:
        problem = parse_shape(shape)
        alone = Path(own_dir) / "served" / shape  # the tuned shapes, and this one's estimate
        shutil.copytree(tuned_dir, alone)
        near = nearest(problem, alone, gpu, checks)
        own = tune(problem, own_dir)
        mine = Kernel(problem, own.entry.config, "exact", checks=checks, gpu=gpu, entry=own.entry)
        yield problem, near, mine, own.search.seconds


def left_out_in_turn(folder: Path, gpu, checks, scratch):
    """The same, from entries already tuned in `folder`: each plain shape held out in turn."""
    source = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    plain = [
        e for e in source.entries().values()
        if e.key.problem.plain and e.key.checks == checks and e.key.space == "device"
    ]  # fmt: skip
    for held in plain:
        others = Path(scratch) / held.key.problem.shape
        store = cache.DeviceCache(others, gpu.fingerprint.as_dict(), versions())
        for entry in plain:
            if entry.key.problem != held.key.problem:
                store.put(entry)
        near = nearest(held.key.problem, others, gpu, checks)
        mine = Kernel(held.key.problem, held.config, "exact", checks=checks, gpu=gpu, entry=held)
        yield held.key.problem, near, mine, held.tuning_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuned", action="append", default=[], metavar="MxNxK")
    parser.add_argument("--held", action="append", default=[], metavar="MxNxK")
    parser.add_argument("--leave-one-out", type=Path, metavar="CACHE_DIR")
    parser.add_argument("--timeout", type=float, default=30.0, help="search seconds per tune")
    parser.add_argument("--checks", choices=("on", "off"), default="off")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.leave_one_out and not (args.tuned and args.held):
        parser.error("give --tuned and --held shapes, or --leave-one-out CACHE_DIR")
    gpu = autotune.get_gpu()
    checks = args.checks == "on"
    rows = []
    with tempfile.TemporaryDirectory() as tuned_dir, tempfile.TemporaryDirectory() as own_dir:
        if args.leave_one_out:
            cases = left_out_in_turn(args.leave_one_out, gpu, checks, tuned_dir)
        else:
            cases = tuned_and_held(args, gpu, checks, tuned_dir, own_dir)
        for problem, near, mine, tuning_s in cases:
            rows.append(time_pair(problem, near, mine, gpu) | {"tuning_s": tuning_s})
    report = {
        "device": gpu.summary,
        "checks": checks,
        "tuned": args.tuned or f"each other shape in {args.leave_one_out}",
        "timeout_s": args.timeout,
        "rows": rows,
    }
    if rows:
        mean = sum(r["regret"] for r in rows) / len(rows)
        report["mean_regret"] = mean
        print(f"mean regret {mean:+.1%}, worst {max(r['regret'] for r in rows):+.1%}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
