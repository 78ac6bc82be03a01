"""Lookup at a shape the cache has no entry for: configs ranked by predicted time (never a
tile grid that leaves the GPU idle), the best few timed at the shape, the fastest kept
in the cache as `estimated`."""

import json
import warnings

import numpy as np
import pytest
from entries import seed_entry

import autotune
from autotune import cache, predict
from autotune.device import versions
from autotune.lookup import _cached, forget
from autotune.problem import Problem
from autotune.space import Config, load_space

H200 = 132


def blocked(**params):
    base = dict(VEC=4, BM=128, TM=8, BN=128, TN=8, BK=16, PAD=0, UNROLL=1, DB=1, AT=1)
    return Config.make("blocked", base | dict(GROUP=1, WARP=0) | params)


def measured(problem, config, seconds):
    entry = seed_entry(problem, "blocked")
    return cache.Entry(
        **(vars(entry) | dict(key=cache.Key.of(problem, config, True), params=config.as_dict()))
        | dict(median_s=seconds)
    )


def test_a_tile_grid_that_fills_few_units_is_predicted_slow():
    big, small = blocked(), blocked(BM=32, TM=4, BN=64, TN=4)
    square, narrow = Problem(4096, 4096, 4096), Problem(128, 128, 65536)
    assert predict.efficiency(big, square, H200) > 0.9  # 1024 tiles: whole waves
    assert predict.efficiency(big, narrow, H200) < 0.01  # one tile on 132 units
    assert predict.efficiency(small, narrow, H200) >= 4 * predict.efficiency(big, narrow, H200)


def test_the_config_fast_at_a_big_square_is_not_ranked_first_for_long_k():
    """The shipped cache's failure: a 128 x 128 tile, the fastest at 4096^3, served
    for 128 x 128 x 65536 launched one workgroup. Split-K's known-good configs, never
    measured, rank above it."""
    square, narrow = Problem(4096, 4096, 4096), Problem(128, 128, 65536)
    entry = measured(square, blocked(), 2.7e-3)  # 51 TFLOP/s
    roof = predict.Roof.of([entry])
    seeds = load_space("splitk").seed_configs(narrow)
    ranked = predict.ranked(narrow, [entry], seeds, H200, roof)
    assert ranked[0].config.template == "splitk"
    assert ranked[-1].config == blocked() and ranked[-1].entry is entry


def test_memory_bound_shapes_scale_with_bytes_not_flops():
    """A config measured at one row predicts four rows (same bytes, 4x the FLOPs) at
    about the same time, as the roofline says for a memory-bound shape."""
    one, four = Problem(1, 4096, 4096), Problem(4, 4096, 4096)
    config = blocked(BM=16, TM=1, BN=64, TN=4, BK=32, AT=0)
    entry = measured(one, config, 20e-6)
    roof = predict.Roof(flops_per_s=50e12, bytes_per_s=4e12)
    (candidate,) = predict.ranked(four, [entry], [], H200, roof)
    # the same time, but for the extrapolation over two doublings of the work
    assert candidate.predicted_s == pytest.approx(20e-6 * (1 + 2 * predict.PER_DOUBLING))


def test_a_small_launch_that_beat_the_model_is_not_predicted_past_the_roofline():
    """The shipped cache's second failure: a 16 x 64 tile measured at 16 x 4096 x 4096 (64
    workgroups, faster than the model's fill term expects) was predicted at 2048 x 12288 x
    4096 below the roofline, ranked first, and served at 0.65x. A config measured at a
    shape like the new one ranks first."""
    few, near, big = Problem(16, 4096, 4096), Problem(2048, 11008, 4096), Problem(2048, 12288, 4096)
    small = measured(few, blocked(BM=16, TM=2, BN=64, TN=4, BK=32, AT=0), 64e-6)
    large = measured(near, blocked(), 3.9e-3)  # 47 TFLOP/s
    roof = predict.Roof.of([small, large])
    ranked = predict.ranked(big, [small, large], [], H200, roof)
    assert [c.entry for c in ranked] == [large, small]
    assert min(c.predicted_s for c in ranked) >= predict.floor_seconds(big, roof)


def test_a_measurement_says_less_the_further_it_is_extrapolated():
    square = Problem(1024, 1024, 1024)
    assert predict.distance(square, square) == 0
    twice, far = Problem(2048, 1024, 1024), Problem(4096, 4096, 1024)
    assert 0 < predict.distance(twice, square) == predict.distance(square, twice)
    assert predict.distance(far, square) == pytest.approx(4 * predict.distance(twice, square))


def test_the_shortlist_times_the_best_families_best():
    """Another family's best is timed even when one family's configs rank above it (the
    model may misjudge a family), up to half the places."""
    sizes = (16, 32, 64, 128)
    candidates = [predict.Candidate(blocked(BM=b), float(i), None) for i, b in enumerate(sizes)]
    splitk = load_space("splitk").seed_configs(Problem(128, 128, 65536))
    candidates += [predict.Candidate(c, 10.0 + i, None) for i, c in enumerate(splitk)]
    chosen = predict.shortlist(candidates, 4)
    assert [c.predicted_s for c in chosen] == [0.0, 1.0, 2.0, 10.0]


@pytest.mark.slow
def test_a_new_shape_is_timed_once_and_then_served_as_estimated(gpu, tmp_path):
    kernel = autotune.lookup(24, 20, 900, cache_dir=tmp_path, gpu=gpu)
    assert kernel.source == "estimated" and kernel.entry.estimated
    (file,) = tmp_path.glob("*.json")
    (key, stored), *_ = json.loads(file.read_text())["entries"].items()
    assert stored["estimated"] is True and key.endswith("24x20x900:b1:none")
    forget()
    again = autotune.lookup(24, 20, 900, cache_dir=tmp_path, gpu=gpu)
    assert again.source == "estimated" and again.config == kernel.config
    A, B = np.ones((24, 900), np.float32), np.ones((900, 20), np.float32)
    assert (again(A, B) == 900).all()


def test_without_estimating_nothing_is_timed_or_kept(gpu, tmp_path):
    kernel = autotune.lookup(24, 20, 300, cache_dir=tmp_path, gpu=gpu, estimate=False)
    assert kernel.source == "predicted" and kernel.entry is None
    assert not list(tmp_path.glob("*.json"))


def test_an_estimate_that_cannot_be_kept_is_served_with_a_warning(gpu, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    store = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    # its lock's path is taken by a folder: the cache cannot be written
    store.path.with_name(store.path.name + ".lock").mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = autotune.lookup(20, 24, 300, cache_dir=folder, gpu=gpu)
    assert kernel.source == "estimated"
    assert any("estimated kernel not kept" in str(w.message) for w in caught)


def test_an_estimated_flag_that_is_not_a_bool_is_refused():
    entry = seed_entry(Problem(16, 16, 16)).to_json()
    with pytest.raises(ValueError, match="estimated"):
        cache.Entry.from_json(entry["key"], entry | {"estimated": "yes"})
    assert cache.Entry.from_json(entry["key"], entry | {"estimated": True}).estimated


def test_estimate_must_be_a_bool(gpu):
    with pytest.raises(ValueError, match="estimate") as caught:
        autotune.lookup(8, 8, 8, gpu=gpu, estimate="no")
    assert caught.value.field == "estimate"


def test_a_tuned_entry_anywhere_is_served_before_an_estimate(gpu, tmp_path):
    """An estimate in the user's cache does not hide a tuned entry of the shipped one,
    however fast it measured."""
    problem = Problem(24, 20, 36)
    mine, shipped = (
        cache.DeviceCache(tmp_path / name, gpu.fingerprint.as_dict(), versions())
        for name in ("mine", "shipped")
    )
    mine.put(seed_entry(problem, "naive", median_s=1e-9, estimated=True))
    shipped.put(seed_entry(problem, "tiled", median_s=1e-3))
    entry = _cached(problem, True, [mine, shipped], lambda e: True)
    assert entry.key.template == "tiled" and not entry.estimated
    assert _cached(problem, True, [mine], lambda e: True).estimated


def test_a_config_measured_for_another_layout_is_a_candidate_a_little_slower():
    """f16 `nt` at a new shape may use what f16 `nn` measured (the same blocking): with
    no `nt` entry it would have only seeds to choose from."""
    nn, nt = Problem(512, 4096, 4096, "f16"), Problem(512, 4096, 4096, "f16", "nt")
    config = load_space("blockedx").seed_configs(nt)[0]
    assert not load_space("blockedx").why_invalid(config, nn)
    entry = seed_entry(nn, "blockedx", key=cache.Key.of(nn, config, True),
                       params=config.as_dict(), median_s=1e-3)  # fmt: skip
    roof = predict.Roof.of([entry])
    (same,) = predict.ranked(nn, [entry], [], H200, roof)
    (other,) = predict.ranked(nt, [entry], [], H200, roof)
    assert other.entry is entry and other.predicted_s == pytest.approx(1.25 * same.predicted_s)


def test_configs_the_floor_makes_equal_keep_their_measured_order():
    """Two configs of one tile measured at a small launch, one 1.5x slower: at a large
    shape both reach the roofline floor, and the faster still ranks first, whichever
    order the cache holds them in."""
    small, large = Problem(512, 512, 4096), Problem(3072, 3072, 4096)
    fast = measured(small, blocked(), 1e-4)
    slow = measured(small, blocked(PAD=1), 1.5e-4)
    roof = predict.Roof(flops_per_s=50e12, bytes_per_s=4e12)
    for entries in ([fast, slow], [slow, fast]):
        ranked = predict.ranked(large, entries, [], H200, roof)
        assert ranked[0].predicted_s == ranked[1].predicted_s  # both at the floor
        assert [c.entry for c in ranked] == [fast, slow]


def test_each_element_type_is_predicted_from_its_own_roof(gpu, tmp_path):
    """f16 entries reach rates f32 never does: an f32 shape's predictions stay at or above
    the roofline of what f32 was measured to reach."""
    from autotune.lookup import _ranked

    store = cache.DeviceCache(tmp_path, gpu.fingerprint.as_dict(), versions())
    f32, f16 = Problem(256, 256, 256), Problem(256, 256, 256, "f16")
    store.put(seed_entry(f32, "blocked", median_s=1e-3))
    if "shader-f16" in gpu.features:
        store.put(seed_entry(f16, "blockedx", median_s=1e-5))  # 100x the f32 rate
    big = Problem(1024, 1024, 1024)
    roof = predict.Roof.of([e for e in store.entries().values() if e.key.problem == f32])
    ranked = _ranked(big, True, [store], gpu, gpu.limits)
    assert min(c.predicted_s for c in ranked) >= predict.floor_seconds(big, roof)


def test_int8_entries_do_not_raise_the_roof_of_float_problems(gpu, tmp_path):
    """int8 dot products reach rates f32 FMA never does: an unquantized f32 shape's
    predictions stay at or above the roofline of what unquantized f32 reached."""
    from autotune.lookup import _ranked

    store = cache.DeviceCache(tmp_path, gpu.fingerprint.as_dict(), versions())
    f32 = Problem(256, 256, 256)
    int8 = Problem(256, 256, 256, "f32", "nt", weights="q8", activations="q8")
    store.put(seed_entry(f32, "blocked", median_s=1e-3))
    store.put(seed_entry(int8, "qdot", median_s=1e-5))  # 100x the f32 rate
    big = Problem(1024, 1024, 1024)
    roof = predict.Roof.of([e for e in store.entries().values() if e.key.problem == f32])
    ranked = _ranked(big, True, [store], gpu, gpu.limits)
    assert min(c.predicted_s for c in ranked) >= predict.floor_seconds(big, roof)


def test_a_quantized_weight_borrows_configs_measured_for_other_quantized_formats(gpu, tmp_path):
    """The quantized families compute every weight format and element type: a q4g128
    problem in f16 ranks configs tuned for q4g32 in f32 and for q4g64 in f16, as other
    variants; one with int8 activations borrows none of them, nor does an unquantized
    problem (an f32 gemv entry would run at f16 too)."""
    from autotune.lookup import _ranked

    if "shader-f16" not in gpu.features:
        pytest.skip("adapter has no shader-f16")
    store = cache.DeviceCache(tmp_path, gpu.fingerprint.as_dict(), versions())
    f32 = Problem(4, 256, 256, "f32", "nt", weights="q4g32")
    f16 = Problem(4, 256, 256, "f16", "nt", weights="q4g64")
    plain = Problem(4, 256, 256, "f32", "nt")
    for problem, template, seed in ((f32, "qgemv", -1), (f16, "qgemv", 0), (plain, "gemv", -1)):
        config = load_space(template).seed_configs(problem, gpu.limits)[seed]  # one per config
        store.put(seed_entry(problem, template, config=config))

    def borrowed(problem):
        ranked = _ranked(problem, True, [store], gpu, gpu.limits)
        return {c.entry.key.problem for c in ranked if c.entry}

    assert borrowed(Problem(8, 512, 256, "f16", "nt", weights="q4g128")) == {f32, f16}
    assert borrowed(Problem(8, 512, 256, "f32", "nt", weights="q4g32")) == {f32, f16}
    int8 = Problem(8, 512, 256, "f32", "nt", weights="q4g32", activations="q8")
    assert borrowed(int8) == set()
    assert borrowed(Problem(8, 512, 256, "f32", "nt")) == {plain}
    assert borrowed(Problem(8, 512, 256, "f16", "nt")) == set()


def test_a_gpu_ranks_what_gpus_of_its_kind_measured(gpu, tmp_path, monkeypatch):
    """A GPU no tune has run on (an H100 beside the shipped H200's file) ranks the configs
    tuned on GPUs of its vendor and kind, OTHER_DEVICE slower than they predict there,
    never another vendor's; beside entries of its own, its own measurement of a config
    ranks, and a kin's entry tuned at the shape outranks its own measured far away at
    the same rates (and is what a tune of the shape tries first, unless this GPU timed
    that config there too)."""
    from autotune.lookup import _ranked, _stores, neighbours

    shipped = tmp_path / "shipped"  # only this test's files: none of a real GPU's
    shipped.mkdir()
    monkeypatch.setattr(cache, "shipped_cache_dir", lambda: shipped)
    own = gpu.fingerprint.as_dict()
    kin = own | {"device": own["device"] + " (another model)", "device_id": 1}
    stranger = kin | {"vendor": "another vendor", "vendor_id": own["vendor_id"] + 1}
    at, big, far = Problem(256, 256, 256), Problem(512, 512, 512), Problem(128, 128, 128)
    kin_config, stranger_config, own_config = load_space("blocked").seed_configs(at, gpu.limits)[:3]
    for fingerprint, config in ((kin, kin_config), (stranger, stranger_config)):
        cache.DeviceCache(tmp_path, fingerprint, versions()).put(
            seed_entry(at, "blocked", config=config)
        )

    def measured():
        ranked = _ranked(big, True, _stores(gpu, tmp_path), gpu, gpu.limits)
        return {c.config: c for c in ranked if c.entry}

    lent = measured()
    assert set(lent) == {kin_config} and lent[kin_config].borrowed
    entry = lent[kin_config].entry
    units = predict.compute_units(kin["device"])
    alone = predict.ranked(big, [entry], [], units, predict.Roof.of([entry]))[0]
    assert lent[kin_config].predicted_s == pytest.approx(alone.predicted_s * predict.OTHER_DEVICE)
    mine = cache.DeviceCache(tmp_path, own, versions())
    mine.put(seed_entry(at, "blocked", config=kin_config))  # the same config, timed here
    assert not measured()[kin_config].borrowed
    mine.put(seed_entry(far, "blocked", config=own_config, median_s=1e-3))
    theirs = cache.DeviceCache(tmp_path, kin, versions())
    theirs.put(seed_entry(big, "blocked", config=stranger_config))
    # the fastest rates both GPUs measured, the same (a decode kernel, invalid at big):
    # the kin's times count here as they are
    for store in (mine, theirs):
        store.put(seed_entry(Problem(1, 4096, 4096, layout="nt"), "gemv", median_s=1e-5))
    first = min(measured().values(), key=lambda c: c.order)
    assert (first.config, first.borrowed) == (stranger_config, True)
    assert neighbours(big, True, gpu, tmp_path, ("blocked",), gpu.limits)[0] == stranger_config
    # timed here at the shape too, slower than the kin's copy: no longer a neighbour
    mine.put(seed_entry(big, "blocked", config=stranger_config, median_s=1e-3))
    assert min(measured().values(), key=lambda c: c.order).borrowed
    assert stranger_config not in neighbours(big, True, gpu, tmp_path, ("blocked",), gpu.limits)


def test_a_borrowed_time_is_converted_to_this_gpus_rates():
    """An entry another GPU measured at a memory-bound shape is predicted here through the
    two GPUs' bandwidths: at half its bandwidth, twice its time (OTHER_DEVICE slower)."""
    at = Problem(1, 4096, 4096, layout="nt")
    entry = seed_entry(at, "gemv", median_s=1e-4)
    theirs = predict.Roof(flops_per_s=60e12, bytes_per_s=4e12)
    ours = predict.Roof(flops_per_s=60e12, bytes_per_s=2e12)
    there = predict.MeasuredOn([entry], theirs, 132)
    [lent] = predict.ranked(at, [], [], 132, ours, [there])
    assert lent.borrowed
    assert lent.predicted_s == pytest.approx(2e-4 * predict.OTHER_DEVICE)


def test_a_borrowed_time_at_another_shape_counts_each_gpus_units_and_a_bounded_roof():
    """Measured elsewhere at P' on 132 units, predicted at P here on 114: P's ideal at
    this GPU's units and rates over P''s at the other's, extrapolated by the distance;
    roofs further apart than ROOF_SPREAD (what each cache happened to tune) convert by
    ROOF_SPREAD alone."""
    measured_at, at = Problem(16, 4096, 4096, layout="nt"), Problem(4, 11008, 4096, layout="nt")
    entry = seed_entry(measured_at, "gemv", median_s=1e-4)
    ours = predict.Roof(flops_per_s=50e12, bytes_per_s=3e12)

    def predicted(theirs):
        there = predict.MeasuredOn([entry], theirs, 132)
        [lent] = predict.ranked(at, [], [], 114, ours, [there])
        return lent.unclamped_s / predict.OTHER_DEVICE

    theirs = predict.Roof(flops_per_s=60e12, bytes_per_s=4e12)
    ideal_here = predict.ideal_seconds(entry.config, at, 114, ours)
    ideal_there = predict.ideal_seconds(entry.config, measured_at, 132, theirs)
    assert ideal_here / ideal_there != pytest.approx(
        predict.ideal_seconds(entry.config, at, 132, ours) / ideal_there
    )  # the unit counts matter at these shapes
    extrapolated = 1 + predict.distance(at, measured_at)
    assert predicted(theirs) == pytest.approx(1e-4 * ideal_here / ideal_there * extrapolated)
    far = predict.Roof(flops_per_s=60e12 * 10, bytes_per_s=4e12 * 10)  # ten times ours
    bounded = predict.Roof(50e12 * predict.ROOF_SPREAD, 3e12 * predict.ROOF_SPREAD)
    assert predicted(far) == pytest.approx(predicted(bounded)) != predicted(theirs)


def test_the_shipped_cache_holds_tuned_entries_only(gpu, monkeypatch):
    """In a checkout the default cache folder is the shipped cache/: a lookup there
    serves its estimate without writing it, and no shipped file holds an estimate."""
    shipped = cache.shipped_cache_dir()
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    monkeypatch.delenv("AUTOTUNE_CACHE", raising=False)
    assert cache.default_cache_dir() == shipped
    forget()
    try:
        with pytest.warns(cache.CacheWarning, match="estimated kernels are not kept; set"):
            kernel = autotune.lookup(27, 19, 45, gpu=gpu)
        assert kernel.source == "estimated"
        assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    finally:  # the checkout as it was, whatever the lookup wrote
        for path in shipped.iterdir():
            if path.name not in before:
                path.unlink()
            elif path.read_bytes() != before[path.name]:
                path.write_bytes(before[path.name])
    for path in shipped.glob("*.json"):
        entries = json.loads(path.read_text())["entries"]
        assert not [k for k, v in entries.items() if v.get("estimated")], path.name
        # no entry chosen for one caller's device of lower limits
        assert {cache.Key.parse(k).space for k in entries} <= {"device", "portable"}


@pytest.mark.parametrize(
    "template, use",
    [
        ("tiled", 3 * 700 / (16 * 704)),  # a 16 x 16 tile: 13 rows of zeros, 4 columns
        ("naive", 3 * 700 / (16 * 704)),  # 16 x 16 invocations, one element each
        ("gemv", 700 / 704),  # every row; strips of 32 columns: 4 past N
        ("blocked", 3 * 700 / (16 * 704)),  # its one seed valid at 3 rows: 16 x 16
    ],
)
def test_tile_use_counts_the_rows_a_workgroup_computes_past_c(template, use):
    """Each family's tile as its space declares it: the tutorial kernel's 16-row tile at
    3 rows computes 13 rows of zeros; the decode family's strip holds every row."""
    problem = Problem(3, 700, 900)
    (config, *_) = load_space(template).seed_configs(problem)
    assert predict.tile_use(config, problem) == pytest.approx(use)


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("N, K", [(700, 900), (4096, 4096)])
def test_without_entries_few_rows_never_rank_a_tutorial_kernel_first(M, N, K):
    """A device with no cache of its own ranks the families' known-good configs alone:
    the 16 x 16 tutorial tile (one element per invocation, most of each tile past C at
    few rows) ranked first at every few-row nn shape, 24x slower than gemv on lavapipe
    at 3 x 700 x 900. One to three rows are the decode family's."""
    from autotune.data import BUILT_IN

    problem = Problem(M, N, K)
    seeds = [c for t in BUILT_IN for c in load_space(t).seed_configs(problem)]
    roof = predict.Roof.of([])
    first = predict.ranked(problem, [], seeds, predict.DEFAULT_UNITS, roof)[0].config
    assert first.template not in ("tiled", "naive")
    assert first.template == "gemv" or M > 3


def test_without_entries_lookup_serves_the_decode_family_at_three_rows(gpu, tmp_path):
    kernel = autotune.lookup(3, 700, 900, cache_dir=tmp_path, gpu=gpu, estimate=False)
    assert kernel.source == "predicted" and kernel.config.template == "gemv"
    A = np.random.default_rng(0).random((3, 900), np.float32)
    B = np.random.default_rng(1).random((900, 700), np.float32)
    np.testing.assert_allclose(kernel(A, B), A.astype(np.float64) @ B, rtol=1e-4)
