"""Command line: a thin layer over the public API.

    python -m autotune tune --shape 256x256x256 --trials 30
    python -m autotune tune --shape 512x1024x1024 --dtype f16 --layout nt --batch 8 \
        --epilogue bias,gelu --trials 30
    python -m autotune tune --model layer.toml --timeout 30
    python -m autotune tune --shape 4096x4096x4096 --trials 200 --gpus all
    python -m autotune lookup --shape 256x256x256 --json
    python -m autotune export --shape 256x256x256 --out kernels/ [--portable]
    python -m autotune export --shape 1x4096x4096 --layout nt --out kernels/ --candidates 4
    python -m autotune devices
    python -m autotune lookup --shape 256x256x256 --adapter nvidia:1
    python -m autotune demo
    python -m autotune cache merge A.json B.json --out merged.json
    python -m autotune quantize W.npy --bits 4 --group 128 --out weights/ [--zero-points]

Bad input exits with code 2 and one line naming the argument; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import device as device_module
from .arguments import ArgumentError, check_folder, name_from
from .data import BUILT_IN
from .files import FileRefused
from .plan import PlanError
from .problem import (
    ACCUMULATE,
    DTYPES,
    EPILOGUE_OPS,
    LAYOUTS,
    ProblemError,
    parse_shape,
    problems_from_file,
)
from .search import DEFAULT_STRATEGY, SAMPLERS
from .space import SpaceError, template_names
from .worker import WorkerError

# API argument names -> the CLI options that set them
_OPTIONS = {"cache_dir": "cache", "templates": "template", "out_dir": "out"}
PORTABLE_TRIALS = 30  # export --portable's tune, where no portable kernel is cached


def _option(field: str) -> str:
    return "--" + _OPTIONS.get(field, field).replace("_", "-")


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line too
        raise UsageError(message)


class _Once(argparse.Action):
    """An option given at most once: a second --shape to a one-shape command is refused
    rather than silently replacing the first."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = namespace.__dict__.setdefault("_given", set())
        if self.dest in seen:
            raise argparse.ArgumentError(self, "given more than once; this command takes one")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m autotune", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _tune_parser(commands)
    _lookup_and_export_parsers(commands)
    _other_parsers(commands)
    _quantize_parser(commands)
    return parser


def _shape_options(command, many: bool, required: bool = True) -> None:
    """The problem's options (--shape and the variant), --checks and --cache."""
    command.add_argument(
        "--shape",
        action="append" if many else _Once,
        required=required,
        metavar="MxNxK",
        help="problem size: C (MxN) = A (MxK) @ B (KxN)" + (" (repeatable)" if many else ""),
    )
    command.add_argument(
        "--dtype",
        default="f32",
        choices=list(DTYPES),
        help="element type (default f32; f16 needs the adapter feature shader-f16)",
    )
    command.add_argument(
        "--layout",
        default="nn",
        choices=list(LAYOUTS),
        help="A then B: n as in A @ B (A is MxK, B is KxN), t stored transposed (nt: B "
        "is NxK, a linear layer's weight); default nn",
    )
    command.add_argument(
        "--batch",
        type=_positive_int,
        default=1,
        help="matrices per operand (a batched GEMM; default 1)",
    )
    command.add_argument(
        "--shared-b", action="store_true", help="one B for the whole batch (--batch > 1)"
    )
    command.add_argument(
        "--epilogue",
        default="none",
        metavar="OPS",
        help="fused after the product, comma-separated, applied in this order: "
        f"{', '.join(EPILOGUE_OPS)} (one activation); e.g. bias,gelu (default none)",
    )
    command.add_argument(
        "--accumulate",
        default="auto",
        choices=list(ACCUMULATE),
        help="f16's accumulation type: auto (the tuner picks the faster), or pinned to "
        "f32 (more accurate) or f16 (default auto)",
    )
    command.add_argument(
        "--weights",
        default="none",
        metavar="FORMAT",
        help="B quantized by `quantize`: q8, q4g32, q4g64, q4g128, with z for zero points "
        "(q4g128z); needs --layout nt (default none: B in --dtype)",
    )
    command.add_argument(
        "--activations",
        default="none",
        choices=["none", "q8"],
        help="q8: the kernel quantizes A's rows to int8 too and sums in integers "
        "(dot4I8Packed; needs --weights); default none: A in --dtype",
    )
    command.add_argument(
        "--checks",
        default="on",
        choices=["on", "off"],
        help="wgpu runtime bounds checks in the shader, as browsers "
        "have them (on, default) or not (off)",
    )
    command.add_argument(
        "--cache",
        metavar="DIR",
        help="cache folder (default: $AUTOTUNE_CACHE, or cache/ in "
        "a checkout, or the user's cache folder)",
    )


def _adapter_option(command) -> None:
    command.add_argument(
        "--adapter",
        metavar="CHOICE",
        help="the adapter: an index (1), a word of its name or backend (nvidia) or "
        "word:index (nvidia:1, the second matching); `devices` lists them (default: "
        f"${device_module.ADAPTER_ENV}, else wgpu's high-performance choice)",
    )


def _tune_parser(commands) -> None:
    """tune: the problems, the budget and how to search."""
    tune = commands.add_parser("tune", help="search, verify and time kernels; cache the best")
    _shape_options(tune, many=True, required=False)
    tune.add_argument(
        "--shapes-from",
        metavar="FILE",
        help='problems listed in a JSON or TOML file (shape = "MxNxK" or M, N, K; dtype; '
        "name), e.g. every GEMM of a model; with --shape, both; duplicates tuned once",
    )
    tune.add_argument(
        "--model",
        metavar="FILE",
        help="a model's problems (same format as --shapes-from): only representatives are "
        "tuned, each standing for the problems of its variant within --radius; lookup "
        "serves the others from the tuned shapes' kernels, ranked and timed at the shape",
    )
    tune.add_argument(
        "--radius",
        type=float,
        default=None,
        help="with --model: how far (summed |log| ratios of M, N and K) a problem may lie "
        "from its representative (default 1.0; 0 tunes every problem)",
    )
    tune.add_argument(
        "--trials",
        type=_positive_int,
        default=None,
        help="measured trials per shape (default 30 unless --timeout is given)",
    )
    tune.add_argument(
        "--timeout", type=_positive_float, default=None, help="seconds of search per shape"
    )
    tune.add_argument(
        "--template",
        action="append",
        choices=template_names(),
        help="template(s) to search (default: all)",
    )
    tune.add_argument(
        "--sampler",
        default=DEFAULT_STRATEGY,
        choices=list(SAMPLERS),
        help=f"search strategy (default {DEFAULT_STRATEGY})",
    )
    tune.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage, e.g. sqlite:///study.db: resumable, shareable",
    )
    tune.add_argument("--seed", type=int, default=None, help="sampler seed")
    tune.add_argument(
        "--gpus",
        metavar="all|N|I,J,...",
        help="GPUs measuring together, each with its worker, on one study per shape "
        "(shapes are spread over them too): all (every adapter of the --adapter's "
        "backend), a count, or adapter indices (0,2,5); identical GPUs only (default 1)",
    )
    _adapter_option(tune)


def _lookup_and_export_parsers(commands) -> None:
    lookup = commands.add_parser("lookup", help="the best known kernel for a shape")
    _shape_options(lookup, many=False)
    lookup.add_argument("--json", action="store_true", help="print JSON instead of text")
    lookup.add_argument(
        "--wgsl",
        action="store_true",
        help="print the kernel's WGSL (alone on stdout; the rest on stderr)",
    )
    lookup.add_argument(
        "--no-estimate",
        dest="estimate",
        action="store_false",
        help="for a shape not in the cache, serve the best ranked config without timing "
        "the best few here (a few seconds) and caching the fastest as estimated",
    )
    _adapter_option(lookup)

    export = commands.add_parser(
        "export", help="write NAME.wgsl, NAME.json (manifest) and NAME.js for each shape"
    )
    _shape_options(export, many=True)
    export.add_argument("--out", required=True, metavar="DIR", help="folder for the bundles")
    export.add_argument(
        "--portable",
        action="store_true",
        help="only configs within WebGPU's default limits (16 KiB workgroup storage, 256 "
        "invocations, 128 MiB per binding); tunes for one when none is cached",
    )
    export.add_argument(
        "--trials",
        type=_positive_int,
        default=None,
        help=f"trials when --portable tunes ({PORTABLE_TRIALS})",
    )
    export.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        help="seconds of search per shape when --portable tunes (the first of it and "
        "--trials ends the search)",
    )
    export.add_argument(
        "--candidates",
        type=_positive_int,
        metavar="K",
        help="a candidate set: up to K verified kernels (this device's, each cached "
        "device's best, the portable best, diverse tile shapes) that time themselves on "
        "the browser's GPU and keep the fastest",
    )
    export.add_argument(
        "--caches",
        nargs="+",
        default=(),
        metavar="PATH",
        help="with --candidates: cache files or folders of other machines to take "
        "candidates from (the cache and the shipped one are always read)",
    )
    _adapter_option(export)


def _other_parsers(commands) -> None:
    """devices, demo and cache merge."""
    devices = commands.add_parser(
        "devices", help="adapters by index: backend, features, limits, fingerprint"
    )
    _adapter_option(devices)
    demo = commands.add_parser(
        "demo", help="render, verify and time each template's default kernel for one shape"
    )
    demo.add_argument("--shape", default="256x256x256", metavar="MxNxK", action=_Once)
    _adapter_option(demo)

    cache_command = commands.add_parser("cache", help="work on cache files")
    cache_actions = cache_command.add_subparsers(dest="action", required=True, parser_class=_Parser)
    merge = cache_actions.add_parser(
        "merge",
        help="merge cache files of one device (e.g. from several machines): per key the "
        "fastest verified entry, with its origin",
    )
    merge.add_argument("files", nargs="+", metavar="FILE", help="cache files (JSON)")
    merge.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="merged file, or a folder (the file then gets the device's cache file name)",
    )


def _quantize_parser(commands) -> None:
    quantize = commands.add_parser(
        "quantize",
        help="quantize a weight (N x K, a .npy file) to q8 or 4-bit: writes NAME.data.bin, "
        "NAME.scales.bin (NAME.zeros.bin) and NAME.json (docs/QUANTIZED.md)",
    )
    quantize.add_argument("W", help="the weight: a 2-D float .npy file, N x K (y = x @ W.T)")
    quantize.add_argument("--bits", type=int, required=True, choices=[4, 8], help="8 or 4")
    quantize.add_argument(
        "--group", type=int, default=None, help="4-bit: K values per scale, 32, 64 or 128"
    )
    quantize.add_argument(
        "--zero-points", action="store_true", help="4-bit: asymmetric, a zero point per group"
    )
    quantize.add_argument(
        "--scales", default="f16", choices=["f16", "f32"], help="scale type (default f16)"
    )
    quantize.add_argument("--out", required=True, metavar="DIR", help="folder for the files")
    quantize.add_argument(
        "--name",
        default=None,
        help="file names' stem (default: W's, any character but letters, digits, '_' and '-' "
        "made '_')",
    )


def _problems(args) -> list:
    shape = getattr(args, "shape", None)
    # (an empty --shape "" is a bad shape, not a missing one)
    shapes = shape if isinstance(shape, list) else [] if shape is None else [shape]
    variant = {}
    if hasattr(args, "layout"):
        variant = dict(
            layout=args.layout,
            batch=args.batch,
            shared_b=args.shared_b,
            epilogue=args.epilogue,
            accumulate=args.accumulate,
            weights=args.weights,
            activations=args.activations,
        )
    dtype = args.dtype if hasattr(args, "dtype") else "f32"
    try:
        # parsed here rather than by argparse, with --dtype, so the error names --shape
        problems = [parse_shape(s, dtype, **variant) for s in shapes]
    except ProblemError as error:
        raise UsageError(f"argument {_option(error.field)}: {error}") from None
    for option in ("shapes_from", "model"):
        if getattr(args, option, None) is not None:  # "" too: a bad file, not none
            try:  # the variant options are the defaults of the file's problems
                problems += problems_from_file(getattr(args, option), dtype, **variant)
            except ProblemError as error:
                raise UsageError(f"argument {_option(option)}: {error}") from None
    if args.command == "tune" and not problems:
        raise UsageError(
            "argument --shape: required: give --shape MxNxK (repeatable), --shapes-from FILE "
            "or --model FILE"
        )
    return list(dict.fromkeys(problems))  # each problem once, in the order given


# What str.splitlines() breaks at: escaped in error messages, which quote the user's text
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


def _one_line(message: str) -> str:
    """An error message on one line, whatever the text it quotes (argparse quotes an
    unrecognized argument, and the file errors a path, as given)."""
    return "".join(repr(c)[1:-1] if c in _LINE_BREAKS else c for c in message)


def main(argv: list[str] | None = None) -> int:
    # Piped output (logs, CI) gets a wide console so the summary table is not folded.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        args = build_parser().parse_args(argv)
        problems = _problems(args)
        code = COMMANDS[args.command](args, problems, console)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except UsageError as error:
        print(_one_line(f"autotune: error: {error}"), file=sys.stderr)
        return 2
    except ArgumentError as error:  # from the API (ProblemError too), named as the option
        # (a field in capitals is an environment variable, which the message names)
        where = "" if error.field.isupper() else f"argument {_option(error.field)}: "
        print(_one_line(f"autotune: error: {where}{error}"), file=sys.stderr)
        return 2
    except (SpaceError, PlanError, FileRefused) as error:  # a template's own files
        print(_one_line(f"autotune: error: argument --template: {error}"), file=sys.stderr)
        return 2
    except (device_module.NoAdapterError, WorkerError) as error:
        print(_one_line(f"autotune: error: {error}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autotune: interrupted; finished results are in the cache", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout's reader stopped early (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 1


# --- commands -------------------------------------------------------------------------


def _adapter(args):
    """The Gpu --adapter names; None without it (the API's default: $AUTOTUNE_ADAPTER)."""
    if getattr(args, "adapter", None) is None:
        return None
    return device_module.gpu_at(args.adapter)


def _tune(args, problems, console: Console) -> int:
    from .model import DEFAULT_RADIUS, choose_representatives
    from .tune import TuneOptions, tune_many

    if args.radius is not None and not args.model:
        raise UsageError("argument --radius: only with --model FILE")
    if args.model and (args.shape or args.shapes_from):
        raise UsageError("argument --model: not with --shape or --shapes-from")
    radius = (DEFAULT_RADIUS if args.radius is None else args.radius) if args.model else None
    trials = args.trials if args.trials or args.timeout else TuneOptions.trials
    budget = f"/{trials}" if trials else ""
    # one GPU (--gpus 1, all on a host of one, a single index): the display of one shape
    # at a time (a bad --gpus is named here, before the display starts)
    sequential = TuneOptions.checked(gpu=_adapter(args), gpus=args.gpus).gpus is None
    display = _TuneDisplay(console, trials or args.timeout, budget, sequential)
    display.count = len(problems)
    if radius is not None:  # the plan is shown once every argument is known to be good
        display.plan = choose_representatives(problems, radius), radius
        display.count = len({a.representative for a in display.plan[0]})
    with display, _named_by_file(args):
        # bad arguments and problems beyond the device: main() names the option
        results = tune_many(
            problems,
            radius=radius,
            on_start=display.start,
            trials=trials,
            timeout=args.timeout,
            templates=args.template,
            checks=args.checks == "on",
            sampler=args.sampler,
            storage=args.storage,
            cache_dir=args.cache,
            seed=args.seed,
            on_trial=display.trial,
            gpu=_adapter(args),
            gpus=args.gpus,
        )
        display.finish(results)
    console.print(_summary(results))
    console.print(_configs(results))
    for path in dict.fromkeys(r.cache_path for r in results):
        console.print(f"cache: {path}")
    return 0 if all(r.entry for r in results) else 1


@contextlib.contextmanager
def _named_by_file(args):
    """A problem refused for its shape (beyond the device) names the file it came from
    when --shape gave none."""
    try:
        yield
    except ProblemError as error:
        option = "model" if args.model else "shapes_from" if args.shapes_from else None
        if option is None or args.shape or error.field not in ("shape", "batch"):
            raise
        path = getattr(args, option)
        raise UsageError(f"argument {_option(option)}: {path}: {error}") from None


class _TuneDisplay:
    """Progress of a tune: a bar per shape (following the trial budget, or the clock when
    only --timeout is given), one for the whole list, and with several GPUs a row per
    GPU: what it measured last, and how many."""

    def __init__(self, console: Console, total: float, budget: str, sequential: bool = True):
        self.console, self.total, self.budget = console, total, budget
        self.sequential = sequential  # one shape at a time (one GPU)
        self.plan = None  # (assignments, radius) of a model, shown before the first shape
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[trials]}"),
            TextColumn("{task.fields[best]}"),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.task = self.overall = None
        self.tasks: dict = {}  # problem -> its bar
        self.gpus: dict = {}  # GPU label -> its row
        self.count = 0  # shapes to tune

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.task is not None:  # started with the first shape
            self.progress.stop()

    def start(self, problem, index: int) -> None:
        if index == 0:  # every argument was checked: show the plan, start the display
            self._show_plan()
            self.progress.start()
        if self.sequential:
            self._complete()
        if index == 1:  # a second shape: a bar for the whole list too
            self.overall = self.progress.add_task(
                "all shapes", total=None, best="", failed=0, trials=""
            )
        if self.overall is not None:
            done = "done" if self.sequential else "begun"
            self.progress.update(self.overall, trials=f"{index} shapes {done}")
        self.task = self.tasks[problem] = self.progress.add_task(
            problem.shape,
            total=self.total,
            best="best -",
            failed=0,
            trials=f"0{self.budget} trials",
        )

    def trial(self, event: dict) -> None:
        result, best = event["result"], event["result"].best
        problem = result.problem
        self.progress.update(
            self.tasks[problem],
            completed=result.study_trials if self.budget else event["elapsed"],
            trials=f"{result.study_trials}{self.budget} trials",
            failed=sum(result.failures.values()),
            best=f"best {self._rate(best, problem)}",
        )
        if event.get("gpu") is not None:
            self._gpu_row(event["gpu"], event["outcome"], problem)

    def _gpu_row(self, label: str, outcome, problem) -> None:
        """The GPU's row: its count, failures, and what it measured last."""
        if label not in self.gpus:
            row = self.progress.add_task(f"gpu {label}", total=None, best="", failed=0, trials="")
            self.gpus[label] = [row, 0, 0]
        row = self.gpus[label]
        row[1] += 1
        row[2] += not outcome.ok
        last = self._rate(outcome, problem) if outcome.ok else outcome.reason
        self.progress.update(
            row[0],
            trials=f"{row[1]} measured",
            failed=row[2],
            best=f"last {problem.shape} {outcome.config}: {last}",
        )

    @staticmethod
    def _rate(outcome, problem) -> str:
        return f"{outcome.measurement.gflops(problem.flops):.1f} GFLOP/s" if outcome else "-"

    def finish(self, results) -> None:
        for task in self.tasks.values():
            self.progress.update(task, completed=self.total)
        for r in results:  # the study's final count, as the table gives it (the last
            # trial can end after the last progress event)
            if r.problem in self.tasks:
                self.progress.update(
                    self.tasks[r.problem], trials=f"{r.search.study_trials}{self.budget} trials"
                )
        if self.overall is not None:
            failed = sum(1 for r in results if not r.entry)
            done = f"{len(results)}/{self.count} shapes"
            self.progress.update(self.overall, completed=len(results), failed=failed, trials=done)

    def _complete(self) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.total)

    def _show_plan(self) -> None:
        if self.plan:
            assignments, radius = self.plan
            self.console.print(
                f"autotune: {self.count} of {len(assignments)} problems to tune "
                f"(radius {radius:g})",
                soft_wrap=True,
            )
            self.console.print(_plan(assignments, radius))


def _plan(assignments, radius: float) -> Table:
    table = Table(caption="lookup serves the others from the tuned kernels, timed at each shape")
    for column in ("problem", "tuned as", "distance"):
        table.add_column(column, overflow="fold")
    for a in assignments:
        same = a.representative == a.problem
        row = (str(a.problem), "itself" if same else a.representative.shape, f"{a.distance:.2f}")
        table.add_row(*row)
    return table


def _summary(results) -> Table:
    table = Table(title="autotune: best kernel per shape")
    for column in (
        "shape",
        "template",
        "ms (spread)",
        "GFLOP/s",
        "tiled 16x16 GFLOP/s",
        "speed-up",
        "trials",
        "failures",
        "wall",
    ):
        table.add_column(column, overflow="fold")
    for r in results:
        p, e = r.problem, r.entry
        base = r.baseline.measurement if r.baseline and r.baseline.ok else None
        failures = ", ".join(f"{k} {v}" for k, v in sorted(r.search.failures.items())) or "0"
        row = [p.shape if p.plain else str(p), "none found", "-", "-", "-", "-"]
        if e is not None:
            row = [
                p.shape if p.plain else str(p),
                e.key.template,
                f"{e.median_s * 1e3:.3g} ({(e.p80_s - e.p20_s) / e.median_s:.0%})",
                f"{e.gflops:.1f}",
                f"{p.flops / base.median_s / 1e9:.1f}" if base else "-",
                f"{base.median_s / e.median_s:.2f}x" if base else "-",
            ]
        table.add_row(*row, str(r.search.study_trials), failures, f"{r.search.seconds:.0f} s")
    return table


def _configs(results) -> str:
    return "\n".join(f"{r.problem.shape}: {r.entry.config if r.entry else '-'}" for r in results)


def _lookup(args, problems, console: Console) -> int:
    from .lookup import lookup

    problem = problems[0]
    gpu = _adapter(args)
    started = time.perf_counter()
    try:
        kernel = lookup(
            **problem.arguments,
            checks=args.checks == "on",
            cache_dir=args.cache,
            estimate=args.estimate,
            gpu=gpu,
        )
    except ProblemError as error:
        raise UsageError(f"argument {_option(error.field)}: {error}") from None
    lookup_s = time.perf_counter() - started  # an estimate made now takes seconds
    entry = kernel.entry
    info = {
        "shape": problem.shape,
        "dtype": problem.dtype,
        **problem.variant_arguments,
        "source": kernel.source,
        "checks": kernel.checks,
        "template": kernel.config.template,
        "config": kernel.config.as_dict(),
        "device": kernel.gpu.summary,
        "tuned_for": entry.key.problem.shape if entry else None,
        "estimated": bool(entry and entry.estimated),  # chosen at this shape, not searched
        "median_s": entry.median_s if entry else None,
        "gflops": entry.gflops if entry else None,
        "lookup_s": round(lookup_s, 3),
    }
    # with --wgsl the WGSL alone goes to stdout (`> kernel.wgsl` compiles), the rest to stderr
    out = sys.stderr if args.wgsl else sys.stdout
    if args.json:
        print(json.dumps(info, indent=1), file=out)
    else:
        width = max(map(len, info))
        described = Console(file=out, width=console.width) if args.wgsl else console
        for name, value in info.items():
            described.print(f"{name:>{width}}: {value}")
    if args.wgsl:
        print(kernel.wgsl)
    return 0


def _export(args, problems, console: Console) -> int:
    import warnings

    from .export import ExportWarning, export
    from .lookup import lookup
    from .tune import tune

    checks = args.checks == "on"
    if args.caches and args.candidates is None:
        raise UsageError("argument --caches: only with --candidates K (a candidate set)")
    for option, value in (("--trials", args.trials), ("--timeout", args.timeout)):
        if value is not None and not args.portable:  # only --portable tunes
            raise UsageError(f"argument {option}: only with --portable")
    trials = PORTABLE_TRIALS if args.trials is None else args.trials
    check_folder("out_dir", args.out, writable=True)  # before any tuning
    gpu = _adapter(args)
    for problem in problems:
        common = dict(problem.arguments, checks=checks, cache_dir=args.cache, gpu=gpu)
        try:
            kernel = lookup(**common, portable=args.portable)
            if args.portable and kernel.source != "exact":
                budget = f"{trials} trials" + (
                    f" or {args.timeout:g} s" if args.timeout else ""
                )  # a big shape on a slow adapter takes minutes: say what it will spend
                console.print(
                    f"{problem.shape}: no portable kernel cached; tuning one ({budget}; "
                    "--trials and --timeout set it)"
                )
                tune(**common, trials=trials, timeout=args.timeout, portable=True)
                kernel = lookup(**common, portable=True)
        except ProblemError as error:
            raise UsageError(f"argument {_option(error.field)}: {error}") from None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExportWarning)
            paths = export(
                kernel, args.out, candidates=args.candidates, cache_dir=args.cache,
                caches=args.caches,
            )  # fmt: skip
        for warning in caught:  # what it replaced, as a line; any other warning as usual
            if issubclass(warning.category, ExportWarning):
                console.print(f"{problem.shape}: {warning.message}", soft_wrap=True)
            else:
                warnings.showwarning(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
        console.print(
            f"{problem.shape}: {kernel.config} ({kernel.source}) -> "
            + ", ".join(str(p) for p in paths.values())
        )
    return 0


def _devices(args, problems, console: Console) -> int:
    adapters = device_module.list_adapters()
    chosen = device_module.adapter_index(_adapter(args) or device_module.get_gpu(), adapters)
    for index, adapter in enumerate(adapters):
        mark = "*" if index == chosen else " "
        console.print(f"{mark} {index}: [bold]{adapter.summary}[/bold]")
        fingerprint = device_module.Fingerprint.of(adapter)
        console.print(f"    fingerprint: {json.dumps(fingerprint.as_dict())}")
        console.print(f"    features: {', '.join(sorted(adapter.features))}")
        limits = {k: adapter.limits[k] for k in device_module.COMPUTE_LIMITS}
        console.print(f"    limits: {json.dumps(limits)}")
    console.print(
        f"* = used (--adapter or {device_module.ADAPTER_ENV}: an index, a word of the name, "
        f"or word:index); versions: {device_module.versions()}"
    )
    return 0


def _demo(args, problems, console: Console) -> int:
    """Render, compile, verify and time each template's default kernel for one shape."""
    from .compile import compile_shader
    from .kernel import check_fits
    from .measure import measure
    from .render import render
    from .space import check_runnable, load_space
    from .verify import verify

    problem = problems[0]
    gpu = _adapter(args) or device_module.get_gpu()
    templates = tuple(reversed(BUILT_IN))  # the tutorial kernels first
    check_fits(problem, gpu)  # refused (exit 2, naming the limit), not an empty table
    check_runnable(problem, gpu.limits, templates)
    console.print(f"device: {gpu.summary}; problem: {problem}")
    table = Table(title=f"default kernel of each template, {problem.shape}")
    for column in ("template", "config", "lines of WGSL", "compile", "error", "GFLOP/s"):
        table.add_column(column)
    for template in templates:
        # its first seed (the tutorial's kernel), else its first config valid here
        space = load_space(template)
        config = next(iter(space.seed_configs(problem, gpu.limits)), None)
        config = config or space.first_config(problem, gpu.limits)
        if config is None:
            continue
        shader = render(config, problem)
        compiled = compile_shader(shader, gpu)
        verdict = verify(compiled, gpu)
        start = time.perf_counter()
        gflops = measure(compiled, gpu).gflops(problem.flops) if verdict.ok else float("nan")
        table.add_row(
            template,
            str(config),
            str(len(shader.wgsl.splitlines())),
            f"{compiled.seconds * 1e3:.0f} ms",
            f"{verdict.error:.2g} ({'ok' if verdict.ok else 'WRONG'})",
            f"{gflops:.2f} ({time.perf_counter() - start:.1f} s)",
        )
    console.print(table)
    return 0


def _cache(args, problems, console: Console) -> int:
    from .cache import MergeError, merge

    try:
        report = merge(args.files, args.out)
    except MergeError as error:  # an input (FILE) or --out
        option = "FILE" if error.field == "paths" else _option(error.field)
        raise UsageError(f"argument {option}: {error}") from None
    console.print(
        f"merged {len(args.files)} file{'' if len(args.files) == 1 else 's'} into "
        f"{report.out}: {report.entries} entries, "
        f"{len(report.conflicts)} keys with different configs (the faster kept), "
        f"{report.skipped} invalid or stale entries left out"
    )
    for key in report.conflicts:
        console.print(f"  conflict: {key}")
    return 0


MAX_NPY_BYTES = 1 << 34  # 16 GiB: a weight read whole into memory
NPY_MAGIC = b"\x93NUMPY"  # how every .npy file begins


def _read_npy(path: str):
    """The array in the .npy file `path` (no pickles), through the bounded reader."""
    import io

    import numpy as np

    from .files import read_limited

    try:
        data = read_limited(path, MAX_NPY_BYTES)
        # (np.load takes any other bytes for a pickle, and .npz for an archive)
        if not data.startswith(NPY_MAGIC):
            raise ValueError("not a .npy file (save the weight with numpy.save)")
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, FileRefused, ValueError, EOFError) as error:
        raise UsageError(f"argument W: {path!r} cannot be read as a .npy array: {error}") from None


def _quantize(args, problems, console: Console) -> int:
    import numpy as np

    from .quantize import quantize

    W = _read_npy(args.W)
    name = args.name if args.name is not None else name_from(Path(args.W).name.removesuffix(".npy"))
    options = {"W": "W", "folder": "--out", "name": "--name"}
    try:
        qw = quantize(W, args.bits, args.group, args.zero_points, args.scales)
        paths = qw.save(args.out, name)
    except ArgumentError as error:
        option = options.get(error.field, _option(error.field))
        raise UsageError(f"argument {option}: {error}") from None
    error = qw.dequantize().astype(np.float64) - W.astype(np.float64)
    console.print(
        f"{qw.format} {qw.shape[0]}x{qw.shape[1]} ({qw.scales.dtype} scales): "
        f"{W.nbytes:,} bytes ({W.dtype}) -> {qw.nbytes:,} bytes; error max "
        f"{np.abs(error).max():.3g}, RMS {np.sqrt(np.mean(error**2)):.3g}",
        soft_wrap=True,
    )
    console.print(", ".join(str(p) for p in paths.values()), soft_wrap=True)
    return 0


COMMANDS = {
    "cache": _cache,
    "quantize": _quantize,
    "tune": _tune,
    "lookup": _lookup,
    "export": _export,
    "devices": _devices,
    "demo": _demo,
}

if __name__ == "__main__":
    sys.exit(main())
