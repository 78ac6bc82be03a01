"""Prediction: how long a config would take at a problem it was not measured at.

Lookup ranks configs by this for a shape the cache has no entry of, so that it never
serves a kernel that leaves most of the GPU idle (a 256 x 128 tile launched twice for a
small M x N with long K; a tall tile for one row). The model is deliberately coarse,
because lookup times the best few at the real shape before it chooses:

    time(P) = max(time(P') * ideal(P) / ideal(P'), floor(P)) * (1 + distance(P, P'))

for a config measured at P' (a cache entry of this device). ideal is the roofline time
at the fastest rates this device's cache has seen for the arithmetic (f32, f16 or int8
dot products; FLOP/s and bytes/s), or where it has seen none, its kin's, on the share of
the GPU the launch keeps busy: the fill of its waves of workgroups, and for the
arithmetic the share of each tile inside C and what one invocation's register patch can
reach. Compute-bound and memory-bound shapes scale as they should, and the model's
errors where it misjudges a config cancel in the ratio where they are the same at P and
P'. Where they are not (a small launch the model judged too slow), nothing is predicted
faster than floor(P), the whole GPU at the roof. Candidates the floor makes equal keep
the order of their unclamped predictions. The further P' is from P, the less its
measurement says: the distance term (a few % per doubling of the work, in FLOPs: shapes
of equal work but other aspect are at distance 0) ranks a config measured at a work like
P's before one extrapolated from far away. A family's known-good configs never measured
on this device are predicted at a fixed share of the ideal. The entries of other GPUs of
this one's vendor and kind (lookup.borrowed) rank beside this device's own, OTHER_DEVICE
slower, their ideal(P') at their GPU's rates and multiprocessors and ideal(P) at this
one's: an H200's time at a memory-bound shape becomes an H100's through the two
bandwidths. A roof is what a cache saw, so it also reflects which shapes were tuned
there: the two roofs convert times by ROOF_SPREAD at most. Where the device has none
valid at P (a GPU no tune has run on) they are its measured candidates, and where its
own were measured far from P an entry tuned at P elsewhere can outrank them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cache import Entry
from .plan import Plan, operand_bindings
from .problem import Problem
from .space import Config, load_space

# Multiprocessors (compute units) by adapter name: WebGPU does not report them. A GPU
# not listed counts as DEFAULT_UNITS, which only shifts where "few workgroups" starts.
UNITS = {"H200": 132, "H100": 132, "A100": 108, "L40": 142, "4090": 128, "3090": 82}
DEFAULT_UNITS = 64
# Invocations that keep a unit busy, roughly, for register-blocked kernels: at 2048^3 the
# 128 workgroups of 256 of a 128 x 256 tile (about one per SM) reached 0.87x cuBLAS.
THREADS_PER_UNIT = 256
SEED_SHARE = 0.4  # the share of the roof an unmeasured known-good config is assumed to reach
# A config measured for another variant (layout, batch, epilogue of the same element type;
# a quantized weight's other element type) is the same blocking with other loads and
# stores: predicted a little slower than measured, so that one measured for this variant
# ranks first at the same prediction.
OTHER_VARIANT = 1.25
# A config measured on another GPU of the same kind (an H200's entry on an H100) is
# predicted from that GPU's time at that GPU's rates, and a little slower, so that a
# config measured here ranks first at the same prediction.
OTHER_DEVICE = 1.25
# A roof is the fastest rate a GPU's cache has seen, so it says as much about which shapes
# were tuned there as about the GPU: two GPUs of one kind whose roofs differ by more than
# this (an H100 tuned at decode shapes only, an H200 at every shape) convert each other's
# times by this ratio at most. Real ones differ by less: HBM 3.35 against 4.8 TB/s.
ROOF_SPREAD = 2.0
# The uncertainty of a prediction per doubling (or halving) of the work between the shape
# measured and the shape predicted.
PER_DOUBLING = 0.03


@dataclass(frozen=True)
class Candidate:
    config: Config
    predicted_s: float
    entry: Entry | None  # the measurement it is predicted from; None for a family's seed
    # before the roofline floor: orders candidates that the floor makes equal
    unclamped_s: float | None = None
    borrowed: bool = False  # its entry was measured on another GPU

    @property
    def order(self) -> tuple[float, float]:
        unclamped = self.predicted_s if self.unclamped_s is None else self.unclamped_s
        return (self.predicted_s, unclamped)


def compute_units(device_name: str) -> int:
    return next((n for key, n in UNITS.items() if key in device_name), DEFAULT_UNITS)


def moved_bytes(problem: Problem) -> int:
    """Bytes the GEMM must move at least: its operands read (and C written) once."""
    return sum(b.size for b in operand_bindings(problem) if b.kind != "uniform")


@dataclass(frozen=True)
class Roof:
    """The fastest rates this device was seen to reach (its cache's entries)."""

    flops_per_s: float
    bytes_per_s: float

    @classmethod
    def of(cls, entries: list[Entry]) -> Roof:
        flops = [e.key.problem.flops / e.median_s for e in entries]
        moved = [moved_bytes(e.key.problem) / e.median_s for e in entries]
        return cls(max(flops, default=1e12), max(moved, default=1e11))

    def within(self, other: Roof, spread: float) -> Roof:
        """These rates, each at most `spread` times faster or slower than `other`'s."""
        return Roof(
            min(max(self.flops_per_s, other.flops_per_s / spread), other.flops_per_s * spread),
            min(max(self.bytes_per_s, other.bytes_per_s / spread), other.bytes_per_s * spread),
        )

    @classmethod
    def highest(cls, roofs: Sequence[Roof]) -> Roof:
        """The fastest rates among `roofs` (other GPUs' where this one has none)."""
        return cls(max(r.flops_per_s for r in roofs), max(r.bytes_per_s for r in roofs))


@dataclass(frozen=True)
class MeasuredOn:
    """Entries measured on one GPU, with the roof of that GPU's rates and its count of
    multiprocessors: what its times are scaled by."""

    entries: list[Entry]
    roof: Roof
    units: int


def fill(plan: Plan, units: int) -> float:
    """The share of the GPU's workgroup slots a launch keeps busy over its waves, in
    (0, 1]."""
    work = plan.work
    groups = math.prod(work.grid)
    slots = units * max(1, min(8, THREADS_PER_UNIT // work.invocations))
    return groups / (math.ceil(groups / slots) * slots)


def tile_use(config: Config, problem: Problem) -> float:
    """The share of the tiles' arithmetic that lands inside C: a tile taller or wider
    than what is left of C computes zeros (a 16-row tile at 3 rows uses 3/16). The tile
    is what the space declares (`tile_rows`, `tile_cols`); a space that declares none
    (a user's template) is counted as wasting nothing."""
    values = load_space(config.template).context(config, problem)
    rows, cols = values.get("tile_rows", 1), values.get("tile_cols", 1)
    M, N = problem.M, problem.N
    return M * N / (math.ceil(M / rows) * rows * math.ceil(N / cols) * cols)


def thread_intensity(config: Config) -> float:
    """The share of its arithmetic rate a register-blocked invocation can reach: a TM x TN
    patch does TM * TN multiply-adds per TM + TN values loaded, and about 4 of them per
    load keep the units busy. A family without TM and TN (the tutorial kernels, gemv)
    counts as 1 x 1: load-bound, which only matters where arithmetic does."""
    params = config.as_dict()
    TM, TN = params.get("TM", 1), params.get("TN", 1)
    return min(1.0, TM * TN / (TM + TN) / 4)


def efficiency(config: Config, problem: Problem, units: int) -> float:
    """The share of the GPU's arithmetic the launch can use, in (0, 1]."""
    plan = load_space(config.template).plan(config, problem)
    return fill(plan, units) * tile_use(config, problem)


def ideal_seconds(config: Config, problem: Problem, units: int, roof: Roof) -> float:
    """The roofline time of `config` at `problem`: the arithmetic at the roof's FLOP/s
    on the share of the GPU it uses, or the bytes at the roof's bandwidth on the share
    of the slots it fills, whichever is longer (idle tile rows cost no bandwidth)."""
    plan = load_space(config.template).plan(config, problem)
    busy = fill(plan, units)
    share = busy * tile_use(config, problem) * thread_intensity(config)
    arithmetic = problem.flops / (roof.flops_per_s * share)
    scratch = 2 * sum(w.size for w in plan.workspaces)  # written, then read back
    return max(arithmetic, (moved_bytes(problem) + scratch) / (roof.bytes_per_s * busy))


def distance(problem: Problem, measured_at: Problem) -> float:
    """How far a measurement at `measured_at` is extrapolated to `problem`: PER_DOUBLING
    for each factor of two between their work (FLOPs)."""
    return PER_DOUBLING * abs(math.log2(problem.flops / measured_at.flops))


def floor_seconds(problem: Problem, roof: Roof) -> float:
    """The fastest `problem` can run: its arithmetic or its bytes on the whole GPU at
    the roof."""
    return max(problem.flops / roof.flops_per_s, moved_bytes(problem) / roof.bytes_per_s)


def predicted_seconds(entry: Entry, problem: Problem, here: MeasuredOn, there: MeasuredOn):
    """The config of `entry`, measured on the GPU `there` (`here` itself for its own), at
    `problem` on the GPU `here` (the module's formula), and the same before the floor."""
    config, measured_at = entry.config, entry.key.problem
    scale = ideal_seconds(config, problem, here.units, here.roof) / ideal_seconds(
        config, measured_at, there.units, there.roof.within(here.roof, ROOF_SPREAD)
    )
    extrapolated = 1 + distance(problem, measured_at)
    unclamped = entry.median_s * scale * extrapolated
    return max(unclamped, floor_seconds(problem, here.roof) * extrapolated), unclamped


def ranked(
    problem: Problem,
    entries: list[Entry],
    seeds: list[Config],
    units: int,
    roof: Roof,
    borrowed: Sequence[MeasuredOn] = (),
) -> list[Candidate]:
    """`entries` (measured at other problems, each valid at `problem`) and `seeds`
    (valid, never measured) as candidates for `problem`, fastest predicted first, one per
    config (see the module's formula). `borrowed`: entries measured on other GPUs."""
    candidates: dict[Config, Candidate] = {}
    variants = {p.variant for p in problem.answered_by}
    here = MeasuredOn(entries, roof, units)
    for there in [here, *borrowed]:
        lent = there is not here
        for entry in there.entries:
            config = entry.config
            seconds, unclamped = predicted_seconds(entry, problem, here, there)
            penalty = (OTHER_DEVICE if lent else 1.0) * (
                1.0 if entry.key.problem.variant in variants else OTHER_VARIANT
            )
            candidate = Candidate(config, seconds * penalty, entry, unclamped * penalty, lent)
            if config not in candidates or candidate.order < candidates[config].order:
                candidates[config] = candidate
    for config in seeds:
        if config not in candidates:
            predicted = ideal_seconds(config, problem, units, roof) / SEED_SHARE
            candidates[config] = Candidate(config, predicted, None)
    # stable: equal predictions keep the seeds' order (each space's fastest known first)
    return sorted(candidates.values(), key=lambda c: c.order)


def shortlist(candidates: list[Candidate], size: int) -> list[Candidate]:
    """The `size` to time: the best of the best-ranked families first (up to half the
    places: a family the model misjudges still gets measured), then the rest in
    predicted order."""
    firsts = {}
    for candidate in candidates:
        firsts.setdefault(candidate.config.template, candidate)
    chosen = sorted(firsts.values(), key=lambda c: c.order)[: max(1, size // 2)]
    rest = [c for c in candidates if c not in chosen]
    return sorted(chosen + rest[: max(0, size - len(chosen))], key=lambda c: c.order)
