"""Representatives: which of a model's GEMMs to tune, the others served from them.

`lookup` serves a problem nobody tuned from the tuned kernels of the device (ranked by
predicted time, the best few timed at its own shape, see autotune.predict). How much
slower the nearest tuned shape's kernel was than tuning the shape (the regret) was
measured on the H200 by holding out each shape of the benchmark suite in turn
(`benchmarks/regret.py --leave-one-out`): every shape whose nearest tuned neighbour lay
within a distance of 1.7 (see `shape_distance`) lost at most 4%, while at 2.1 and
beyond some lost 20-63%. `DEFAULT_RADIUS` keeps a margin below that.
"""

from __future__ import annotations

from dataclasses import dataclass

from .arguments import is_number, shown
from .problem import Problem, ProblemError, shape_distance

# e.g. 2048x11008x4096 and 2048x12288x4096 (0.11) share a kernel, 1024^3 and 2048^3
# (2.08) do not; one dimension twice as large is 0.69
DEFAULT_RADIUS = 1.0


@dataclass(frozen=True)
class Assignment:
    problem: Problem
    representative: Problem  # the problem itself when it is tuned
    distance: float


def check_radius(radius) -> float:
    if not is_number(radius) or not 0 <= radius < 50:
        raise ProblemError(
            "radius", f"radius must be a number >= 0 and < 50, got {shown(radius, 40)}"
        )
    return float(radius)


def choose_representatives(problems: list[Problem], radius: float = DEFAULT_RADIUS):
    """Each problem with the problem to tune for it: greedily, the largest (in FLOPs) not
    yet covered becomes a representative and covers every uncovered problem of its variant
    within `radius`. Largest first because the time a model spends is mostly theirs, so
    they are tuned exactly. Returns one Assignment per problem, in the order given."""
    radius = check_radius(radius)
    chosen: dict[Problem, Assignment] = {}
    for rep in sorted(dict.fromkeys(problems), key=lambda p: -p.flops):
        if rep in chosen:
            continue
        chosen[rep] = Assignment(rep, rep, 0.0)
        for other in problems:
            if other not in chosen and other.variant == rep.variant:
                distance = shape_distance(rep, other)
                if distance <= radius:
                    chosen[other] = Assignment(other, rep, distance)
    return [chosen[p] for p in dict.fromkeys(problems)]
