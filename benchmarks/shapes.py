"""The benchmarks' named shape sets, defined here only (bench.py --set NAME, all.sh).

- suite: the f32 suite of the README's tables (nn).
- decode: a linear layer (nt: y = x @ W.T, W stored [out, in]) at 1, 4 and 16 tokens.
- longk: few outputs, a long sum (nn).
- outofbox: shapes nobody tunes, drawn once with a fixed seed from LLM layers and odd
  sizes, kept in out-of-box.toml: how well `lookup` serves a shape out of the box.
  `python benchmarks/shapes.py` prints the file's text from the generator (a test checks
  that it matches the committed file); never tune these shapes.
- odd: sizes no vector width divides (odd M, N and K), drawn with a fixed seed, nn or nt;
  never tuned either: how lookup serves sizes whose rows are not whole vectors.

With AUTOTUNE_BENCH_QUICK=1 (all.sh --quick) a set keeps its first QUICK_ROWS problems
and every size is shrunk to a tiny one of the same character (1-16 stay, larger ones
become 16 + size // 64), and lookup serves a shape without an entry its best ranked
config untimed (`estimate=False`), for a dry run on a CPU adapter in seconds.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from autotune.problem import Problem, named_problems_from_file, parse_shape  # noqa: E402

SUITE = [
    "1024x1024x1024",
    "2048x2048x2048",
    "4096x4096x4096",
    "8192x8192x8192",
    "2048x12288x4096",
    "2048x11008x4096",
    "2048x4096x11008",
    "512x32000x4096",
    "16x4096x4096",
    "64x11008x4096",
]
DECODE_TOKENS = (1, 4, 16)
DECODE_LAYERS = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))  # (N, K)
LONGK = ["128x128x65536", "512x512x16384"]

OUT_OF_BOX_FILE = Path(__file__).parent / "out-of-box.toml"
OUT_OF_BOX_SEED = 20261201
# Tokens per GEMM, and (out, in) widths of linear layers: LLaMA-7B, LLaMA-3-8B and
# Mistral-7B (same widths), GPT-2, Phi-2, Qwen2-7B (fused q, k, v; MLP; projections).
TOKENS = (1, 3, 7, 32, 100, 333, 1000, 3000)
LINEAR_LAYERS = (
    (12288, 4096), (4096, 4096), (11008, 4096), (4096, 11008),
    (6144, 4096), (14336, 4096), (4096, 14336),
    (2304, 768), (768, 768), (3072, 768), (768, 3072),
    (7680, 2560), (2560, 2560), (10240, 2560), (2560, 10240),
    (4608, 3584), (3584, 3584), (18944, 3584), (3584, 18944),
)  # fmt: skip
LLM_DRAWS, ODD_DRAWS = 10, 2
ODD_SEED, ODD_SHAPES, ODD_LARGEST = 20261202, 10, 4095

QUICK_ENV = "AUTOTUNE_BENCH_QUICK"
QUICK_ROWS = 4


def quick() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def shrunk(problem: Problem) -> Problem:
    """A tiny problem of the same character (see the module doc)."""
    M, N, K = (min(d, 16) + d // 64 for d in (problem.M, problem.N, problem.K))
    return replace(problem, M=M, N=N, K=K)


def draw_out_of_box(seed: int = OUT_OF_BOX_SEED) -> list[Problem]:
    """The out-of-box shapes: LLM_DRAWS from TOKENS x LINEAR_LAYERS, nn or nt, then
    ODD_DRAWS of sizes from 1 to 2048 (nn); each shape once."""
    rng = random.Random(seed)
    problems: list[Problem] = []
    while len(problems) < LLM_DRAWS + ODD_DRAWS:
        if len(problems) < LLM_DRAWS:
            (N, K), M = rng.choice(LINEAR_LAYERS), rng.choice(TOKENS)
            problem = Problem(M, N, K, layout=rng.choice(("nn", "nt")))
        else:
            problem = Problem(*(rng.randint(1, 2048) for _ in range(3)))
        if problem.shape not in {p.shape for p in problems}:
            problems.append(problem)
    return problems


def draw_odd(seed: int = ODD_SEED) -> list[Problem]:
    """The odd set: ODD_SHAPES shapes of odd sizes up to ODD_LARGEST, nn or nt."""
    rng = random.Random(seed)
    return [
        Problem(*(2 * rng.randint(0, ODD_LARGEST // 2) + 1 for _ in range(3)),
                layout=rng.choice(("nn", "nt")))
        for _ in range(ODD_SHAPES)
    ]  # fmt: skip


def out_of_box_text(problems: list[Problem]) -> str:
    """out-of-box.toml's text for `problems` (the format of models/*.toml)."""
    lines = [
        "# Shapes nobody tunes: how well `lookup` serves a shape out of the box. Written by",
        "# `python benchmarks/shapes.py > benchmarks/out-of-box.toml` (seed "
        f"{OUT_OF_BOX_SEED}): {LLM_DRAWS}",
        "# drawn from LLM tokens x linear-layer widths, nn or nt, and "
        f"{ODD_DRAWS} of odd sizes. Do not tune them.",
    ]
    for p in problems:
        lines += ["", "[[problems]]", f'shape = "{p.shape}"', f'layout = "{p.layout}"']
    return "\n".join(lines) + "\n"


def set_problems(name: str, dtype: str = "f32") -> list[Problem]:
    """The problems of set `name` in `dtype` (shrunk in quick mode)."""
    if name not in SETS:
        raise ValueError(f"unknown set {name!r}; known: {', '.join(SETS)}")
    if name == "outofbox":
        problems = [p for _, p in named_problems_from_file(OUT_OF_BOX_FILE, dtype)]
    elif name == "odd":
        problems = [replace(p, dtype=dtype) for p in draw_odd()]
    elif name == "decode":
        problems = [
            Problem(M, N, K, dtype, layout="nt") for (N, K) in DECODE_LAYERS for M in DECODE_TOKENS
        ]
    else:
        problems = [parse_shape(s, dtype) for s in (SUITE if name == "suite" else LONGK)]
    if not quick():
        return problems
    tiny = [shrunk(p) for p in problems[:QUICK_ROWS]]
    return [replace(p, M=p.M | 1, N=p.N | 1, K=p.K | 1) for p in tiny] if name == "odd" else tiny


SETS = ("suite", "decode", "longk", "outofbox", "odd")

if __name__ == "__main__":
    print(out_of_box_text(draw_out_of_box()), end="")
