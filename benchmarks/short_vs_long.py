"""Does a short tune reach a long one? Per shape, a tune of SHORT seconds (with
`--sampler`, default the tuner's) and one of LONG seconds, each into a cache of its own, then
both kernels timed back to back on the same data in alternating rounds: gap = short /
long - 1 (within 3%: gap <= 0.03).

    python benchmarks/short_vs_long.py --shape 2048x2048x2048 --shape 64x11008x4096 \
        --shape 1x4096x4096 --short 60 --long 600 --chunk 280 --out DIR

The long tunes keep their Optuna study in DIR (SQLite), so a run may stop after CHUNK
seconds of search and the next run with the same DIR carries on where it stopped, until
LONG seconds were searched: a 10-minute tune fits calls of a few minutes. DIR/state.json
counts the seconds spent; a shape whose two tunes are done is timed and written to
DIR/rows.json, and the table of every finished shape is printed last. A DIR resumes only
with the `--sampler` and `--short` its short tunes had: `--sampler tpe` for one whose
short tunes ran when TPE was the tuner's default (its state.json names no sampler).

`--long-from ROWS` (an earlier run's rows.json) takes each problem's long tune from there
(the row of the same shape, dtype and layout, however long it searched): its config is
re-timed in this run beside a new short tune, so the short search (which
starts from the configs measured at other shapes, `lookup.neighbours`) is compared with
the same 10 minutes of search without spending them again. Each row names the configs
the short tune was seeded with.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from timing import verified, wgsl_timing  # noqa: E402

import autotune  # noqa: E402
from autotune.lookup import forget  # noqa: E402
from autotune.problem import parse_shape  # noqa: E402
from autotune.search import DEFAULT_STRATEGY, SAMPLERS  # noqa: E402
from autotune.space import Config, load_space  # noqa: E402
from autotune.verify import Reference  # noqa: E402

ROUNDS = 3  # alternating rounds of timing per kernel
LONG_SAMPLER = "tpe"  # the long tunes' strategy, as in the earlier runs' rows (resumable)


def tune_for(problem, seconds: float, folder: Path, storage: str | None, gpu, sampler: str):
    """Tune `problem` for `seconds` of search into `folder`: the wall time it took, and
    the configs the search tried first (measured at other shapes)."""
    started = time.monotonic()
    result = autotune.tune(
        **problem.arguments, trials=None, timeout=seconds, checks=False,
        cache_dir=folder, storage=storage, gpu=gpu, sampler=sampler,
    )  # fmt: skip
    return time.monotonic() - started, [str(c) for c in result.search.first]


def advance(problem, args, state: dict, budget: float, gpu) -> float:
    """The short tune if not done, then the long one's next `budget` seconds at most;
    the seconds of long search spent."""
    shape = problem.shape
    done = state.setdefault(shape, {"short_s": 0.0, "long_s": 0.0, "wall_s": {}})
    if not done["short_s"]:
        done["wall_s"]["short"], done["seeded_with"] = tune_for(
            problem, args.short, args.out / f"short-{shape}", None, gpu, args.sampler
        )
        done["short_s"], done["short_sampler"] = args.short, args.sampler
    if args.long_from is not None:  # searched in the earlier run, for as long as it was
        earlier = args.long_from[str(problem)]["tuning"]
        done["long_s"], done["long_from_earlier_run"] = earlier["long_s"], True
        done["wall_s"]["long"] = earlier["wall_s"]["long"]
        return 0.0
    left = min(args.long - done["long_s"], budget)
    if left <= 0:
        return 0.0
    storage = f"sqlite:///{args.out / f'long-{shape}.db'}"
    wall, _ = tune_for(problem, left, args.out / f"long-{shape}", storage, gpu, LONG_SAMPLER)
    done["long_s"] += left
    done["wall_s"]["long"] = done["wall_s"].get("long", 0.0) + wall
    return left


def stale_long_configs(long_from: dict, problems: list) -> list[str]:
    """The earlier rows' long configs that today's spaces would not render at their
    problem (one tuned before its space gained a parameter), each with the reason:
    refused before any tune runs, not after."""
    stale = []
    for problem in problems:
        try:
            config = Config.parse(long_from[str(problem)]["long_config"])
            reason = load_space(config.template).why_invalid(config, problem)
        except (ValueError, KeyError) as error:  # SpaceError too: an unknown template
            reason = f"not a config of today's spaces ({error!r:.120})"
        if reason:
            stale.append(f"{problem}: {reason}")
    return stale


def other_short_tunes(state: dict, args) -> list[str]:
    """The shapes whose short tune in `state` (an earlier run into the same --out) had
    another sampler or length than this run's: resuming would compare unlike tunes."""
    return [
        f"{shape}: {done.get('short_sampler', 'tpe')}, {done['short_s']:g} s"
        for shape, done in state.items()
        if done["short_s"]
        and (done.get("short_sampler", "tpe"), done["short_s"]) != (args.sampler, args.short)
    ]


def tuned_config(problem, name: str, args, gpu) -> Config:
    """The config the `name` tune of `problem` kept (a long one given by --long-from)."""
    if name == "long" and args.long_from is not None:
        return Config.parse(args.long_from[str(problem)]["long_config"])
    forget()
    kernel = autotune.lookup(**problem.arguments, checks=False, gpu=gpu, estimate=False,
                             cache_dir=args.out / f"{name}-{problem.shape}")  # fmt: skip
    assert kernel.source == "exact", f"{name} tune of {problem} kept nothing"
    return kernel.config


def time_both(problem, args, gpu) -> dict:
    """Both tunes' kernels, verified, timed in alternating rounds on the same data."""
    reference = Reference(problem, seed=0)
    kernels = {}
    for name in ("short", "long"):
        config = tuned_config(problem, name, args, gpu)
        kernels[name] = (config, verified(config, problem, gpu, False, reference))
    rounds = {"short": [], "long": []}
    for _ in range(ROUNDS):
        for name, (_, ready) in kernels.items():
            rounds[name].append(wgsl_timing(ready, gpu, reference)["seconds"])
    short, long = (statistics.median(rounds[n]) for n in ("short", "long"))
    return {
        "shape": problem.shape,
        "problem": str(problem),
        "short_config": str(kernels["short"][0]),
        "long_config": str(kernels["long"][0]),
        "short_kernel_s": short,
        "long_kernel_s": long,
        "gap": short / long - 1,
    }


def table(rows: list[dict], args) -> str:
    lines = [
        f"short tune {args.short:g} s of search against long tune {args.long:g} s, checks off",
        "| problem | short: kernel ms | long: kernel ms | gap | within 3% |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['problem']} | {r['short_kernel_s'] * 1e3:.4g} | {r['long_kernel_s'] * 1e3:.4g}"
            f" | {r['gap']:+.1%} | {'yes' if r['gap'] <= 0.03 else 'no'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", action="append", required=True, metavar="MxNxK")
    parser.add_argument("--layout", default="nn", choices=("nn", "nt", "tn", "tt"))
    parser.add_argument("--dtype", default="f32", choices=("f32", "f16"))
    parser.add_argument("--short", type=float, default=60.0, help="seconds of search")
    parser.add_argument("--long", type=float, default=600.0, help="seconds of search")
    parser.add_argument("--chunk", type=float, default=None,
                        help="seconds of long search in this run (default: all of it)")  # fmt: skip
    parser.add_argument("--long-from", type=Path, metavar="ROWS",
                        help="an earlier run's rows.json: its long configs, re-timed")  # fmt: skip
    parser.add_argument("--sampler", default=DEFAULT_STRATEGY, choices=SAMPLERS,
                        help="the short tune's strategy (the long one's is tpe)")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not 0 < args.short <= args.long:
        parser.error("--short and --long must be seconds with 0 < short <= long")
    if args.long_from is not None:
        args.long_from = {r["problem"]: r for r in json.loads(args.long_from.read_text())}
        problems = [parse_shape(s, args.dtype, layout=args.layout) for s in args.shape]
        missing = [str(p) for p in problems if str(p) not in args.long_from]
        if missing:
            parser.error(f"--long-from has no long tune of {', '.join(missing)}")
        stale = stale_long_configs(args.long_from, problems)
        if stale:
            parser.error(f"--long-from's long configs are not valid today: {'; '.join(stale)}")
    args.out.mkdir(parents=True, exist_ok=True)
    state_file, rows_file = args.out / "state.json", args.out / "rows.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    other = other_short_tunes(state, args)
    if other:
        parser.error(f"{args.out} holds short tunes of other settings ({', '.join(other)}): "
                     f"give another --out")  # fmt: skip
    gpu = autotune.get_gpu()
    budget = args.chunk if args.chunk else args.long * len(args.shape)
    for shape in args.shape:
        problem = parse_shape(shape, args.dtype, layout=args.layout)
        if any(r["shape"] == problem.shape for r in rows):
            continue
        if budget <= 0:
            break  # this run's seconds are spent: the next shape waits for the next run
        budget -= advance(problem, args, state, budget, gpu)
        state_file.write_text(json.dumps(state, indent=1))
        done = state[problem.shape]
        if done["long_s"] >= args.long or done.get("long_from_earlier_run"):
            rows.append(time_both(problem, args, gpu) | {"tuning": state[problem.shape]})
            rows_file.write_text(json.dumps(rows, indent=1))
    print(table(rows, args))
    left = [s for s in args.shape if not any(r["shape"] == s for r in rows)]
    if left:
        print(f"not finished (run again with the same --out): {', '.join(left)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
