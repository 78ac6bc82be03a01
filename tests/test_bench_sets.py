"""The benchmarks' shape sets, model files and cuBLAS operands, checked without a GPU
(the scripts that time them run in tests/test_benchmarks.py)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune import cache
from autotune.__main__ import _problems, build_parser
from autotune.problem import LAYOUTS, Problem, named_problems_from_file, problems_from_file
from autotune.verify import Reference

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import search_efficiency  # noqa: E402
import shapes  # noqa: E402
import timing  # noqa: E402


def shipped_problems() -> list[Problem]:
    """The problem of every entry in the shipped cache files."""
    return [
        cache.Entry.from_json(key, data).key.problem
        for path in cache.shipped_cache_dir().glob("*.json")
        for key, data in json.loads(path.read_text())["entries"].items()
    ]


def test_out_of_box_file_is_the_generators_draw_and_nobody_tuned_it():
    drawn = shapes.draw_out_of_box()
    assert shapes.OUT_OF_BOX_FILE.read_text() == shapes.out_of_box_text(drawn)
    assert shapes.set_problems("outofbox") == drawn
    assert len({p.shape for p in drawn}) == 12 and {p.layout for p in drawn} == {"nn", "nt"}
    llm = drawn[: shapes.LLM_DRAWS]
    assert all(p.M in shapes.TOKENS and (p.N, p.K) in shapes.LINEAR_LAYERS for p in llm)
    shipped = shipped_problems()
    assert shipped and not {(p.shape, p.layout) for p in shipped} & {
        (p.shape, p.layout) for p in drawn
    }


def test_odd_set_is_odd_sizes_nobody_tuned(monkeypatch):
    monkeypatch.delenv(shapes.QUICK_ENV, raising=False)
    odd = shapes.set_problems("odd", "f16")
    assert len({p.shape for p in odd}) == shapes.ODD_SHAPES and {p.dtype for p in odd} == {"f16"}
    assert all(d % 2 == 1 and d <= shapes.ODD_LARGEST for p in odd for d in (p.M, p.N, p.K))
    assert {p.layout for p in odd} == {"nn", "nt"}
    shipped = {p.shape for p in shipped_problems()}
    assert shipped and not shipped & {p.shape for p in odd}


def test_sets_hold_the_documented_shapes(monkeypatch):
    monkeypatch.delenv(shapes.QUICK_ENV, raising=False)
    assert [p.shape for p in shapes.set_problems("suite")] == shapes.SUITE
    decode = shapes.set_problems("decode", "f16")
    assert len(decode) == 12 and {p.M for p in decode} == {1, 4, 16}
    assert {(p.N, p.K) for p in decode} == {
        (4096, 4096),
        (11008, 4096),
        (4096, 11008),
        (14336, 4096),
    }
    assert {(p.layout, p.dtype) for p in decode} == {("nt", "f16")}
    assert [p.shape for p in shapes.set_problems("longk")] == ["128x128x65536", "512x512x16384"]
    with pytest.raises(ValueError, match="unknown set 'nope'"):
        shapes.set_problems("nope")
    monkeypatch.setenv(shapes.QUICK_ENV, "1")
    tiny = shapes.set_problems("longk")
    assert [p.shape for p in tiny] == ["18x18x1040", "24x24x272"]


@pytest.mark.parametrize("model", ["llama-7b", "llama3-8b"])
def test_model_files_name_every_gemm_and_tune_model_reads_them(model):
    path = BENCHMARKS / "models" / f"{model}-layer.toml"
    named = named_problems_from_file(path)
    phases = [name.split(":")[0] for name, _ in named]
    assert phases == ["prefill"] * 5 + ["decode"] * 5  # gate and up: one row each
    assert named[2][1] == named[3][1] and "gate" in named[2][0] and "up" in named[3][0]
    assert all(p.layout == "nt" for _, p in named)
    assert problems_from_file(path) == list(dict.fromkeys(p for _, p in named))
    args = build_parser().parse_args(["tune", "--model", str(path), "--timeout", "20"])
    assert _problems(args) == problems_from_file(path)


def test_llama3_layer_has_grouped_query_attention_widths():
    named = dict(named_problems_from_file(BENCHMARKS / "models" / "llama3-8b-layer.toml"))
    assert named["prefill: q, k, v (fused)"].shape == "512x6144x4096"  # 4096 + 2 x 1024
    assert named["decode: MLP down"].shape == "1x4096x14336"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch, shared_b", [(1, False), (3, False), (3, True)])
def test_cublas_operands_compute_the_problem_in_its_layout(layout, batch, shared_b):
    problem = Problem(5, 7, 3, layout=layout, batch=batch, shared_b=shared_b)
    rng, made = np.random.default_rng(0), []

    def make(shape):
        made.append(rng.uniform(-1, 1, shape).astype(np.float32))
        return made[-1]

    op_a, op_b, C = timing.reference_operands(problem, make)
    product = np.matmul(op_a, op_b)
    assert product.shape == C.shape
    want = Reference(problem, operands=(made[0], made[1])).want
    np.testing.assert_allclose(product, want, rtol=1e-5, atol=1e-6)


def test_bytes_moved_are_the_operands_once_in_the_dtype():
    assert timing.min_bytes(Problem(2, 3, 4)) == 4 * (2 * 4 + 4 * 3 + 2 * 3)
    f16 = Problem(2, 3, 4, "f16", layout="nt", batch=2, shared_b=True)
    assert timing.min_bytes(f16) == 2 * (2 * 2 * 4 + 3 * 4 + 2 * 2 * 3)
    assert timing.cublas_bytes(f16) == 2 * timing.min_bytes(f16)


def test_search_efficiency_summary_counts_trials_to_the_best_and_gaps_at_checkpoints():
    """Per run, the first trial within 5% of the best (None where none was); at each
    checkpoint within the budget, the median over runs of the best so far's gap."""
    best = 1.0
    curves = [
        [2.0, None, 1.04] + [1.5] * 47,  # within 5% at trial 3
        [None] * 30 + [1.2] * 20,  # best 1.2 from trial 31; never within 5%
        [3.0] * 24 + [1.0] + [2.0] * 25,  # the best itself at trial 25
    ]
    summary = search_efficiency.summarised(curves, best, budget=50)
    assert summary["trials_needed"] == [3, None, 25]
    assert (summary["runs"], summary["reached"], summary["worst"]) == (3, 2, 25)
    assert summary["median"] == summary["mean"] == 14
    # At 25 trials the runs' bests are 1.04, none (inf) and 1.0; at 50: 1.04, 1.2, 1.0.
    assert summary["median_slower_than_best_at"] == {25: 0.04, 50: 0.04}
    none_reached = search_efficiency.summarised([[2.0, None]], best, budget=2)
    assert none_reached["reached"] == 0 and none_reached["median"] is None
    assert none_reached["median_slower_than_best_at"] == {}  # no checkpoint within 2 trials
