"""Time: how long one dispatch of a verified kernel takes on the GPU.

With the timestamp-query feature: one compute pass holds R dispatches, R chosen so the
pass lasts at least `min_pass_s`; the pass is bracketed by timestamp writes and run
`passes` times; the result is the median (and 20th/80th percentiles) of pass time / R.
Each pass is also timed by the wall clock (submit to completion) as a cross-check.
Without timestamps the wall clock is the measurement, and `method` says so.
`time_back_to_back` times several kernels that way with the GPU kept busy, its clocks up first.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import wgpu

from .compile import Compiled
from .device import Gpu
from .kernel import Bound, input_arrays
from .verify import random_operands

MAX_REPEATS = 4096
DROP_FLOOR_S = 1e-3  # back to back: one dispatch under this is timed whatever the others took
METHODS = ("timestamp", "wall")  # GPU timestamp queries, or the host's clock without them


class TooSlow(RuntimeError):
    """One dispatch took longer than the caller's limit: the candidate is not timed further."""


@dataclass(frozen=True)
class Measurement:
    """Seconds per dispatch: median and spread over passes, and how they were taken."""

    median_s: float
    p20_s: float
    p80_s: float
    method: str  # "timestamp" or "wall"
    repeats: int  # dispatches per pass
    passes: int
    wall_median_s: float  # wall clock per dispatch, the cross-check

    def gflops(self, flops: int) -> float:
        return flops / self.median_s / 1e9

    def as_dict(self) -> dict:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict) -> Measurement:
        """A measurement as recorded (e.g. on a shared study's trial), checked: times of 0
        to an hour, a known method; ValueError otherwise."""
        seconds = [float(data[k]) for k in ("median_s", "p20_s", "p80_s", "wall_median_s")]
        if not all(0 < s < 3600 for s in seconds) or data["method"] not in METHODS:
            raise ValueError(f"not a measurement: {str(data)[:120]}")
        median, p20, p80, wall = seconds
        counts = [data["repeats"], data["passes"]]
        if not all(type(c) is int and 1 <= c <= MAX_REPEATS * 1000 for c in counts):
            raise ValueError(f"not a measurement: {str(data)[:120]}")
        return cls(
            median, p20, p80, data["method"], int(data["repeats"]), int(data["passes"]), wall
        )

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: the relative spread of the passes."""
        return (self.p80_s - self.p20_s) / self.median_s


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class _PassTimer:
    """Runs passes of R dispatches; returns (timestamp seconds or None, wall seconds)."""

    def __init__(self, bound: Bound, gpu: Gpu, use_timestamps: bool):
        self.bound, self.gpu = bound, gpu
        self.query_set = None
        if use_timestamps:
            self.query_set = gpu.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
            self.resolved = gpu.device.create_buffer(
                size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
            )

    def run(self, repeats: int) -> tuple[float | None, float]:
        encoder = self.gpu.device.create_command_encoder()
        writes = None
        if self.query_set is not None:
            writes = {
                "query_set": self.query_set,
                "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1,
            }
        self.bound.encode(encoder, repeats, writes)
        if self.query_set is not None:
            encoder.resolve_query_set(self.query_set, 0, 2, self.resolved, 0)
        start = time.perf_counter()
        self.gpu.queue.submit([encoder.finish()])
        self.gpu.wait_idle()
        wall = time.perf_counter() - start
        if self.query_set is None:
            return None, wall
        ticks = np.frombuffer(self.gpu.queue.read_buffer(self.resolved), dtype=np.uint64)
        return float(ticks[1] - ticks[0]) * self.gpu.timestamp_period_ns * 1e-9, wall

    def release(self):
        if self.query_set is not None:
            self.query_set.destroy()
            self.resolved.destroy()


@contextmanager
def _timer(compiled: Compiled, gpu: Gpu, operands, seed: int, use_timestamps: bool):
    """A _PassTimer over `compiled` bound to `operands` (else random ones from `seed`)
    and a zeroed C; its buffers released on leaving."""
    problem = compiled.shader.problem
    rng = np.random.default_rng(seed)
    A, B = operands if operands is not None else random_operands(problem, rng)
    C = np.zeros(problem.matrix_shapes()["C"], dtype=problem.numpy_dtype)
    bound = Bound.make(compiled, gpu, input_arrays(A, B) | {"C": C})
    timer = _PassTimer(bound, gpu, use_timestamps)
    try:
        yield timer
    finally:
        timer.release()
        bound.release()


def measure(
    compiled: Compiled,
    gpu: Gpu,
    *,
    min_pass_s: float = 0.005,
    passes: int = 7,
    budget_s: float = 2.0,
    max_dispatch_s: float | None = None,
    use_timestamps: bool | None = None,
    seed: int = 0,
    operands: tuple[np.ndarray, np.ndarray] | None = None,
    warmup_s: float = 0.05,
    max_warmup_s: float = 0.4,
) -> Measurement:
    """Time one dispatch of `compiled` on random data (see the module doc for the method).

    Slow kernels get fewer passes (at least 3) so one candidate costs about `budget_s`;
    one whose single dispatch exceeds `max_dispatch_s` raises TooSlow.
    """
    if use_timestamps is None:
        use_timestamps = gpu.has_timestamps
    with _timer(compiled, gpu, operands, seed, use_timestamps) as timer:
        # Warm up (first-use costs) and size the pass from one dispatch, then once more
        # from a pass of that size, since a single dispatch is dominated by overhead.
        timer.run(1)
        stamp, wall = timer.run(1)
        one = stamp if stamp else wall
        if max_dispatch_s is not None and one > max_dispatch_s:
            raise TooSlow(f"one dispatch took {one:.3g} s, more than {max_dispatch_s:.3g} s")
        repeats = _repeats_for(one, min_pass_s)
        if repeats > 1:
            stamp, wall = timer.run(repeats)
            one = (stamp if stamp else wall) / repeats
            repeats = _repeats_for(one, min_pass_s)
        passes = max(3, min(passes, int(budget_s / (one * repeats))))
        # Keep the GPU busy until its clocks are up: after the host-side work between
        # candidates (compile, verification) they are down, and on the H200 they took
        # longer than a few short passes to come back (the first candidate of a 4096^3
        # search measured at half speed). Warm for at least `warmup_s`, then until three
        # passes in a row are no faster than the best one (2% slack), at most
        # `max_warmup_s`.
        busy, fastest, steady = 0.0, math.inf, 0
        while busy < max_warmup_s and (busy < warmup_s or steady < 3):
            stamp, wall = timer.run(repeats)
            busy += wall
            seconds = stamp if stamp is not None else wall
            steady = steady + 1 if seconds >= 0.98 * fastest else 0
            fastest = min(fastest, seconds)
        samples, walls = [], []
        for _ in range(passes):
            stamp, wall = timer.run(repeats)
            walls.append(wall / repeats)
            samples.append((stamp if stamp is not None else wall) / repeats)
    return Measurement(
        median_s=statistics.median(samples),
        p20_s=_quantile(samples, 0.2),
        p80_s=_quantile(samples, 0.8),
        method="timestamp" if use_timestamps else "wall",
        repeats=repeats,
        passes=passes,
        wall_median_s=statistics.median(walls),
    )


def _repeats_for(seconds_per_dispatch: float, min_pass_s: float) -> int:
    if seconds_per_dispatch <= 0:
        return MAX_REPEATS
    return max(1, min(MAX_REPEATS, math.ceil(min_pass_s / seconds_per_dispatch)))


def time_back_to_back(
    kernels: list[Compiled],
    gpu: Gpu,
    *,
    operands: tuple[np.ndarray, np.ndarray] | None = None,
    clocks_up_s: float = 0.3,
    rounds: int = 2,
    drop_slower: float | None = None,
    **settings,
) -> list[Measurement | None]:
    """Each of `kernels` (compiled and verified beforehand) timed with the GPU kept busy:
    the first run until the clocks are up (warm_up, at least `clocks_up_s`), then
    `rounds` rounds in alternating order; each kernel's time is its faster round.

    After host-side work (compiling, verifying, a program's start) the H200's clocks are
    down and come back slowly: a kernel timed then can measure several times slower
    than it runs, and a choice among such timings is noise. With `drop_slower`, a kernel
    whose one dispatch in the first round is that many times the fastest so far (and
    over DROP_FLOOR_S) is not timed at all (None). Give `operands`: drawing them for
    each kernel (a quantized weight's are packed on the host) idles the GPU in between.
    `settings` are measure()'s.
    """
    if not kernels:
        return []
    warm_up(kernels[0], gpu, operands=operands, min_s=clocks_up_s)
    fastest: list[Measurement | None] = [None] * len(kernels)
    for round_number in range(rounds):
        order = range(len(kernels)) if round_number % 2 == 0 else reversed(range(len(kernels)))
        for i in order:
            if round_number and fastest[i] is None:
                continue  # dropped in the first round
            # a kernel once timed is never dropped: one dispatch may be a slow one
            limit = _drop_limit(fastest, drop_slower) if round_number == 0 else None
            try:
                m = measure(kernels[i], gpu, operands=operands, max_dispatch_s=limit, **settings)
            except TooSlow:
                continue
            if fastest[i] is None or m.median_s < fastest[i].median_s:
                fastest[i] = m
    return fastest


def _drop_limit(fastest: list[Measurement | None], drop_slower: float | None) -> float | None:
    """The longest one dispatch may take before it is dropped: `drop_slower` times the
    fastest kernel's time so far, never under DROP_FLOOR_S (one dispatch of a fast
    kernel is mostly submission overhead, above all by the wall clock); None: no limit."""
    times = [m.median_s for m in fastest if m is not None]
    if drop_slower is None or not times:
        return None
    return max(drop_slower * min(times), DROP_FLOOR_S)


def warm_up(
    kernel: Compiled,
    gpu: Gpu,
    *,
    operands: tuple[np.ndarray, np.ndarray] | None = None,
    min_s: float = 0.3,
    max_s: float = 1.5,
    window_s: float = 0.1,
) -> float:
    """Keep the GPU busy with `kernel` for at least `min_s`, then until two windows of
    `window_s` in a row are no faster than the fastest before them (2% slack), at most
    `max_s`; returns the seconds spent. A window's speed is its fastest pass. After 3 s
    idle the H200 ran one kernel at 5.3x its time for 0.12 s, 4.5x until 0.32 s, then
    at full speed: a plateau of two windows, which a single steady window mistakes for
    the top, two in a row do not."""
    with _timer(kernel, gpu, operands, 0, gpu.has_timestamps) as timer:
        stamp, wall = timer.run(1)
        repeats = _repeats_for(stamp or wall, 0.01)
        busy, fastest, steady = wall, math.inf, 0
        while busy < max_s and (busy < min_s or steady < 2):
            window_best, window_busy = math.inf, 0.0
            while window_busy < window_s:
                stamp, wall = timer.run(repeats)
                window_busy += wall
                window_best = min(window_best, (stamp or wall) / repeats)
            busy += window_busy
            steady = steady + 1 if window_best >= 0.98 * fastest else 0
            fastest = min(fastest, window_best)
    return busy
