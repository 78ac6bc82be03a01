"""Search efficiency: measured trials each sampler needs to come within 5% of the best
config of the whole space, and how far from it its best is after 25, 50, ... trials,
replayed from a full timing table of one shape.

    # 1. measure every valid config of every template (on the device to study)
    python benchmarks/search_efficiency.py record --shape 16x16x1024 \
        --out benchmarks/results/table-lavapipe-16x16x1024.json
    # 2. replay the real search loop (autotune.search.search) on the table, many seeds
    python benchmarks/search_efficiency.py replay benchmarks/results/table-lavapipe-16x16x1024.json

Replaying runs the tuner's own code (Optuna ask/tell, pruning, de-duplication) with the
GPU replaced by the table, so samplers are compared on exactly the same measurements.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from math import inf
from pathlib import Path

import autotune
from autotune.data import BUILT_IN as TEMPLATES
from autotune.device import Fingerprint, versions
from autotune.evaluate import Outcome, Replay, evaluate
from autotune.measure import Measurement
from autotune.problem import parse_shape
from autotune.search import SAMPLERS, search
from autotune.space import Config, load_space


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def record(args) -> None:
    problem = parse_shape(args.shape)
    gpu = autotune.get_gpu()
    templates = args.template or list(TEMPLATES)
    configs = [c for t in templates for c in load_space(t).configs(problem, gpu.limits)]
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}  # resume an interrupted run
    results = table.get("results", {})
    table.update(
        problem=problem.shape,
        templates=templates,
        limits=gpu.limits,
        fingerprint=gpu.fingerprint.as_dict(),
        device=gpu.summary,
        versions=versions(),
        checks=True,
        date=time.strftime("%Y-%m-%d"),
        commit=git_commit(),
        results=results,
    )
    start = time.monotonic()
    for i, config in enumerate(configs):
        if str(config) in results:
            continue
        outcome = evaluate(config, problem, gpu, checks=True)
        results[str(config)] = {
            "template": config.template,
            "params": config.as_dict(),
            "seconds": outcome.measurement.median_s if outcome.ok else None,
            "reason": outcome.reason,
            "compile_s": outcome.compile_s,
        }
        if i % 25 == 0 or i == len(configs) - 1:
            out.write_text(json.dumps(table, indent=0))
            print(f"{i + 1}/{len(configs)} configs, {time.monotonic() - start:.0f} s", flush=True)
    out.write_text(json.dumps(table, indent=0))


@dataclass
class Recorded:
    """Stands in for the Gpu in search(): the recorded limits and fingerprint."""

    limits: dict
    fingerprint: Fingerprint


def stale_templates(results: dict, templates, problem, limits: dict) -> list[str]:
    """Why the table cannot be replayed, for each template whose space's valid configs at
    `problem` are not those the table measured: an interrupted record (a part of them),
    or a space that gained or lost a parameter or a value since (the search would
    propose configs the table never measured, or the table's best is one it cannot)."""
    recorded: dict[str, set] = {}
    for text, row in results.items():
        recorded.setdefault(row["template"], set()).add(text)
    why = []
    for t in templates:
        valid = {str(c) for c in load_space(t).configs(problem, limits)}
        have = recorded.get(t, set())
        if have < valid:
            why.append(f"{t}: incomplete, {len(have)} of {len(valid)} valid configs "
                       f"measured (run record again to resume it)")  # fmt: skip
        elif have != valid:
            why.append(f"{t}: not the valid configs of its space now "
                       f"(record the table again with this checkout)")  # fmt: skip
    return why


CHECKPOINTS = (25, 50, 100, 200, 400)  # budgets at which a run's best so far is compared


def replayed(problem, device, templates, sampler, seed, evaluator, budget) -> list:
    """The seconds of each measured trial of one replayed search (None: it failed), in
    the order measured, over the whole budget."""
    seconds = []

    def on_trial(event):
        outcome = event["outcome"]
        seconds.append(outcome.measurement.median_s if outcome.ok else None)

    search(problem, device, templates=templates, trials=budget, sampler=sampler, seed=seed,
           evaluator=Replay(evaluator), on_trial=on_trial)  # fmt: skip
    return seconds


def summarised(curves: list[list], best: float, budget: int) -> dict:
    """Per sampler: the trials each run needed to come within 5% of `best` (None: not
    within the budget) and their median, mean and worst; at each checkpoint within the
    budget, the median over runs of how much slower than `best` its best so far was (a
    run that ended sooner had measured every valid config)."""
    needed = [
        next((i + 1 for i, s in enumerate(c) if s is not None and s <= 1.05 * best), None)
        for c in curves
    ]
    reached = sorted(n for n in needed if n is not None)
    slower = {}
    for checkpoint in CHECKPOINTS:
        if checkpoint <= budget:
            bests = [min((s for s in c[:checkpoint] if s is not None), default=inf) for c in curves]
            slower[checkpoint] = round(statistics.median(bests) / best - 1, 4)
    return {
        "runs": len(curves),
        "reached": len(reached),
        "median": statistics.median(reached) if reached else None,
        "mean": statistics.mean(reached) if reached else None,
        "worst": reached[-1] if reached else None,
        "trials_needed": needed,
        "median_slower_than_best_at": slower,
    }


def replay(args) -> None:
    table = json.loads(Path(args.table).read_text())
    problem = parse_shape(table["problem"])
    device = Recorded(table["limits"], Fingerprint(**table["fingerprint"]))
    templates = args.template or table["templates"]
    results = table["results"]
    stale = stale_templates(results, templates, problem, table["limits"])
    if stale:
        sys.exit(f"{args.table}: {'; '.join(stale)}")
    times = {
        k: v["seconds"]
        for k, v in results.items()
        if v["seconds"] is not None and v["template"] in templates
    }
    best = min(times.values())
    good = {k for k, s in times.items() if s <= 1.05 * best}

    def evaluator(config: Config) -> Outcome:
        row = results[str(config)]
        if row["seconds"] is None:
            return Outcome(config, reason=row["reason"] or "crashed")
        s = row["seconds"]
        return Outcome(config, Measurement(s, s, s, "timestamp", 1, 1, s), error=0.0)

    order = [k for k in results if results[k]["template"] in templates]  # enumeration order
    report = {
        "table": args.table,
        "templates": templates,
        "configs": len(order),
        "exhaustive_first_within_5pct": 1 + next(i for i, k in enumerate(order) if k in good),
        "within_5pct": len(good),
        "best_s": best,
        "budget": args.budget,
        "runs": args.runs,
        "samplers": {},
    }
    for sampler in args.sampler or ("climb", "tpe", "random", "grid"):
        runs = 1 if sampler == "grid" else args.runs
        curves = [
            replayed(problem, device, templates, sampler, seed, evaluator, args.budget)
            for seed in range(runs)
        ]
        report["samplers"][sampler] = summarised(curves, best, args.budget)
        print(sampler, report["samplers"][sampler], flush=True)
    suffix = "".join("-" + name for name in (args.template or []) + (args.sampler or []))
    stem = Path(args.table).stem.replace("table-", "replay-") + suffix
    out = Path(args.table).with_name(stem + ".json")
    out.write_text(json.dumps(report, indent=1))
    print(
        f"{len(order)} configs, {len(good)} within 5% of the best ({best * 1e3:.3f} ms), the "
        f"first of them #{report['exhaustive_first_within_5pct']} in enumeration order; "
        f"written {out}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("--shape", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--template", action="append", help="record only these templates")
    rep = commands.add_parser("replay")
    rep.add_argument("table")
    rep.add_argument("--runs", type=int, default=20)
    rep.add_argument("--budget", type=int, default=300)
    rep.add_argument("--template", action="append", help="replay only these templates")
    rep.add_argument("--sampler", action="append", choices=SAMPLERS, help="only these samplers")
    args = parser.parse_args(argv)
    {"record": record, "replay": replay}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
