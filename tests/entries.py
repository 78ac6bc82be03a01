"""A cache entry as a tune would store it, for the tests that write cache files."""

from autotune import cache
from autotune.problem import Problem
from autotune.space import load_space


def seed_entry(
    problem: Problem, template: str = "naive", checks: bool = True, config=None, **fields
):
    """The entry of `config` (default: `template`'s first seed) at `problem`, measured at
    0.1 ms (`fields` replace any of its values, e.g. date)."""
    config = config or load_space(template).seed_configs(problem)[0]
    values = dict(
        key=cache.Key.of(problem, config, checks),
        params=config.as_dict(),
        median_s=1e-4,
        p20_s=1e-4,
        p80_s=1e-4,
        method="timestamp",
        gflops=problem.flops / 1e-4 / 1e9,
        error=1e-7,
        date=cache.today(),
    )
    return cache.Entry(**(values | fields))
