"""Lookup: the best known kernel for a problem on this device, and `matmul`.

Order: an entry for this exact problem in the user's cache, then in the shipped cache/
(tuned there, or estimated by an earlier lookup); else the configs this device's cache
measured at other shapes and each family's known-good configs, ranked by predicted time
at this shape (autotune.predict), the best few verified here and timed back to back
(a few seconds), the fastest kept in the user's cache marked `estimated`, so the next
call is instant; a sound default config last. Every config not tuned for this exact
problem is verified at it before it is handed out.
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path

import numpy as np
import wgpu

from . import cache, predict
from .arguments import ArgumentError, check_flag, check_folder
from .compile import CompileError, compile_shader, missing_features
from .data import BUILT_IN
from .device import Gpu, get_gpu, given_gpu, portable_limits, versions
from .kernel import Kernel, check_fits, check_operands
from .key import SPACES, Key
from .measure import time_back_to_back
from .problem import Problem, ProblemError
from .render import render
from .space import Config, check_runnable, load_space
from .verify import Reference, verify

MEMO_SIZE = 256  # kernels memoized per device
_MEMOIZED: weakref.WeakSet = weakref.WeakSet()  # the devices (Gpus) with memoized kernels
_MEMO_LOCK = threading.Lock()
_FORGOTTEN = [0]  # forget()s so far: a lookup begun before one is not memoized
# a new shape's estimate, about: half of it verifying the shortlist (at least one), then
# timing it back to back (2-7 s in all on the H200: a quantized weight's reference and
# verification are the slowest)
ESTIMATE_S = 2.0
SHORTLIST = 6  # ranked configs timed at a new shape (each family's best among them)
NEIGHBOURS = 4  # measured configs a tune of a new shape tries first


def _stores(gpu: Gpu, cache_dir) -> list[cache.DeviceCache]:
    folders = cache.lookup_folders(cache_dir)
    return [cache.DeviceCache(f, gpu.fingerprint.as_dict(), versions()) for f in folders]


def runs_here(limits: dict, problem: Problem, gpu: Gpu):
    """accept(config): valid for `problem` within `limits`, and its kernel needs no
    feature the device lacks (a subgroup kernel on a device requested without them)."""

    def accept(config: Config) -> bool:
        invalid = load_space(config.template).why_invalid(config, problem, limits)
        return not invalid and not missing_features(config, problem, gpu)

    return accept


def _serves(limits: dict, problem: Problem, gpu: Gpu, portable: bool):
    """serves(entry): a cached entry this device is served: its config runs here, and it
    was chosen for this device's space (a device below its adapter is served the
    adapter's entries and its own; the adapter's devices are not served a choice made
    within lower limits, which may be far from their best)."""
    runs = runs_here(limits, problem, gpu)
    own = gpu.limited_as(portable)
    spaces = {*SPACES} | ({f"limited-{own}"} if own else set())
    return lambda entry: entry.key.space in spaces and runs(entry.config)


def _verified(problem, config: Config, source, checks, gpu, reference, entry=None):
    """(a Kernel of `config`, its verdict) if it compiles and verifies at `problem` on
    this device, else None."""
    try:
        compiled = compile_shader(render(config, problem), gpu, checks=checks)
    except CompileError:
        return None
    verdict = verify(compiled, gpu, reference=reference)
    if not verdict.ok:
        return None
    kernel = Kernel(problem, config, source, checks=checks, gpu=gpu, entry=entry)
    kernel._compiled = compiled
    return kernel, verdict


def _ranked(problem, checks, stores, gpu, limits) -> list[predict.Candidate]:
    """Every config this device's caches measured (at any shape and, in the same element
    type, any layout, batch or epilogue; a quantized weight's in any quantized format with
    the same activations; in this mode) and each family's known-good configs, valid at
    `problem`, fastest predicted first, with what GPUs like it measured (borrowed)."""
    runs = runs_here(limits, problem, gpu)
    usable, rates, measured = _measured(problem, checks, stores, runs)
    lent = borrowed(problem, checks, stores, gpu, runs)
    if rates:
        roof = predict.Roof.of(rates)
    elif lent:  # none of this arithmetic measured here: the rates of GPUs of its kind
        roof = predict.Roof.highest([other.roof for other in lent])
    else:
        roof = predict.Roof.of(measured)
    seeds = [c for c in _seeds(problem, limits) if runs(c)]
    units = predict.compute_units(gpu.fingerprint.device)
    return predict.ranked(problem, usable, seeds, units, roof, lent)


def _measured(problem, checks, stores, runs) -> tuple[list[cache.Entry], ...]:
    """The tuned entries of `stores` that are `problem`'s neighbours (valid here, its
    element type or another quantized format of its activations), those whose rates make
    the roof (its arithmetic's, else the kin formats'; none if neither is measured) and
    every tuned entry of the mode."""
    measured = [
        e
        for store in stores
        for e in store.entries().values()
        if e.key.checks == checks and not e.estimated and cache.is_current(e)
    ]  # (the roof from tuned entries only: an estimate's three short passes are noisier)
    # each arithmetic its own roof: f16 runs faster, int8 dot products faster still
    typed = [e for e in measured if e.key.problem.arithmetic == problem.arithmetic]
    kin = [e for e in measured if _another_quantized_format(e.key.problem, problem)]
    return [e for e in typed + kin if runs(e.config)], typed or kin, measured


def borrowed(problem, checks, stores, gpu: Gpu, runs) -> list[predict.MeasuredOn]:
    """Per GPU like this one (cache.kin_devices) in the stores' folders: its entries
    that are `problem`'s neighbours, the roof of its rates and its multiprocessors. A GPU
    no tune has run on (most users') starts from what was tuned on its kin rather than
    from seeds alone, and one tuned at other shapes from what its kin tuned at this one."""
    folders = list(dict.fromkeys(store.folder for store in stores))
    lent = []
    for store in cache.kin_devices(folders, gpu.fingerprint.as_dict(), versions()):
        usable, rates, _ = _measured(problem, checks, [store], runs)
        if usable:
            units = predict.compute_units(store.fingerprint["device"])
            lent.append(predict.MeasuredOn(usable, predict.Roof.of(rates), units))
    return lent


def _another_quantized_format(measured_at: Problem, problem: Problem) -> bool:
    """Whether `measured_at` has a quantized weight as `problem` does, with the same
    activation format but another element type or weight format (q4g32 beside q4g128,
    q8): the same families compute both (the codes per word and the scales per group are
    values their spaces check), so its configs are neighbours too, predicted from their
    own time as another variant. Most formats have no tuned entry of their own."""
    return (
        problem.weights != "none"
        and measured_at.weights != "none"
        and measured_at.activations == problem.activations
        and measured_at.arithmetic != problem.arithmetic
    )


def neighbours(problem, checks, gpu: Gpu, cache_dir, templates, limits) -> list[Config]:
    """The NEIGHBOURS configs of `templates` this device's caches (and its kin's,
    borrowed) measured at other shapes or variants (valid here within `limits`) that
    predict fastest at `problem`: what a tune tries first, so that a short one starts
    from what worked nearby. Not this device's entries of the problem: a tune's time to
    a good kernel is measured from them (its kin's are its best guess)."""
    stores = _stores(gpu, cache_dir)
    timed_here = {
        e.config
        for store in stores
        for e in store.entries().values()
        if e.key.problem == problem and e.key.checks == checks
    }  # every entry of the problem, estimates and stale ones too (unlike _measured): a
    # config timed here at the problem in any way is no neighbour, and nor is a copy of
    # one that another GPU of its kind measured
    ranked = _ranked(problem, checks, stores, gpu, limits)
    measured = [c.config for c in ranked if c.entry and c.config not in timed_here]
    return [c for c in measured if c.template in templates][:NEIGHBOURS]


def _seeds(problem: Problem, limits) -> list[Config]:
    """Every built-in family's known-good configs valid at `problem`, family by family."""
    return [c for t in BUILT_IN for c in load_space(t).seed_configs(problem, limits)]


def _first_verified(configs, source, problem, checks, gpu, reference) -> Kernel | None:
    """A Kernel of the first of `configs` that compiles and verifies at `problem`."""
    for config in configs:
        found = _verified(problem, config, source, checks, gpu, reference)
        if found is not None:
            return found[0]
    return None


def _timed(shortlisted, problem, checks, gpu, reference, budget_s) -> list[tuple]:
    """(measurement, kernel, verdict) for the shortlisted configs that verify: compiled
    and verified first (at least one, the others within half of `budget_s`), then
    timed back to back on the reference's operands (measure.time_back_to_back: after
    that host-side work the GPU's clocks are down; timed between compiles, the
    estimates' timings on the H200 were 2.9-5.7x slow and the choice noise). A
    candidate 4x slower than the best so far in one dispatch is dropped."""
    deadline = time.monotonic() + budget_s / 2
    ready = []
    for candidate in shortlisted:
        if ready and time.monotonic() > deadline:
            break
        found = _verified(problem, candidate.config, "estimated", checks, gpu, reference)
        if found is not None:
            ready.append(found)
    kernels = [kernel._compiled for kernel, _ in ready]
    times = time_back_to_back(
        kernels, gpu, operands=(reference.A, reference.B), drop_slower=4,
        min_pass_s=0.002, passes=3, max_warmup_s=0.1, warmup_s=0.02,
    )  # fmt: skip
    timed = zip(times, ready, strict=True)
    return [(m, kernel, verdict) for m, (kernel, verdict) in timed if m is not None]


def _estimate(problem, checks, stores, gpu, limits, reference, portable, budget_s):
    """The ranked configs' best at `problem`: the shortlist verified (in about half of
    `budget_s`) and timed, the fastest cached (a budget of 0: the first that verifies,
    untimed)."""
    started = time.monotonic()
    ranked = _ranked(problem, checks, stores, gpu, limits)
    if budget_s <= 0:
        configs = [c.config for c in ranked]
        return _first_verified(configs, "predicted", problem, checks, gpu, reference)
    shortlisted = predict.shortlist(ranked, SHORTLIST)
    timed = _timed(shortlisted, problem, checks, gpu, reference, budget_s)
    if not timed:  # none of the shortlist computes it correctly here: the rest, in order
        rest = [c.config for c in ranked if c not in shortlisted]
        return _first_verified(rest, "predicted", problem, checks, gpu, reference)
    measurement, kernel, verdict = min(timed, key=lambda t: t[0].median_s)
    key = Key.of(problem, kernel.config, kernel.checks, portable, gpu.limited_as(portable))
    entry = cache.Entry.measured(
        key, kernel.config, measurement, verdict.error,
        tuning_s=time.monotonic() - started, estimated=True,
    )  # fmt: skip
    if _keeps_estimates(stores[0]):
        try:
            stores[0].put(entry)
        except (OSError, cache.CacheError) as error:  # served all the same, chosen again
            cache.warn_once(f"{stores[0].path}: estimated kernel not kept: {error}")
    else:  # the next call estimates again: say how to keep them
        cache.warn_once(
            f"{stores[0].folder}: the checkout's shipped cache keeps tuned entries only, "
            f"so estimated kernels are not kept; set ${cache.CACHE_ENV} (or cache_dir) "
            "to a folder of your own to keep them"
        )
    kernel.entry = entry
    return kernel


def _keeps_estimates(store: cache.DeviceCache) -> bool:
    """Whether an estimate is written to `store`: not into the shipped cache (a
    checkout's default folder holds tuned entries only; it is served all the same, and
    memoized in the process)."""
    return store.folder.resolve() != cache.shipped_cache_dir().resolve()


def default_kernel(
    problem: Problem,
    gpu: Gpu,
    checks: bool = True,
    limits: dict | None = None,
    reference: Reference | None = None,
) -> Kernel:
    """A sound untuned kernel, verified at this shape: the first known-good config valid
    here, else the first valid config of each template. A problem no config can run
    within the device's limits is refused with the limit named."""
    limits = limits or gpu.limits
    check_runnable(problem, limits, BUILT_IN)
    reference = reference or Reference(problem)
    configs = _seeds(problem, limits) + [
        load_space(t).first_config(problem, limits) for t in BUILT_IN
    ]
    configs = dict.fromkeys(c for c in configs if c is not None)
    kernel = _first_verified(configs, "default", problem, checks, gpu, reference)
    if kernel is not None:
        return kernel
    raise ProblemError("shape", f"no default kernel computes {problem} correctly on this device")


def _cached(problem, checks, stores, serves) -> cache.Entry | None:
    """The problem's fastest tuned entry in the first store that has one; else its
    estimate, likewise (an estimate never hides a tuned entry of a later store); of the
    entries `serves(entry)` allows."""
    for tuned in (True, False):
        for store in stores:
            accept = lambda e, tuned=tuned: e.estimated != tuned and serves(e)  # noqa: E731
            entry = store.best(problem, checks, accept)
            if entry is not None:
                return entry
    return None


def _memoized(problem, checks, cache_dir, gpu, portable, estimate_s) -> Kernel:
    """_lookup's kernel, memoized on the device (gpu.memo, MEMO_SIZE most recent), so
    that a caller's device and its kernels are collected together. Threads may look up
    and forget at once (the lock guards the memo, not the lookup itself)."""
    key = (problem, checks, cache_dir, portable, estimate_s)
    with _MEMO_LOCK:
        kernel = gpu.memo.pop(key, None)
        if kernel is not None:
            gpu.memo[key] = kernel  # the most recently used last
            return kernel
        begun = _FORGOTTEN[0]
    kernel = _lookup(problem, checks, cache_dir, gpu, portable, estimate_s)
    with _MEMO_LOCK:
        if _FORGOTTEN[0] != begun:  # forgotten meanwhile (a tune wrote): served, not kept
            return kernel
        gpu.memo[key] = kernel
        while len(gpu.memo) > MEMO_SIZE:
            gpu.memo.pop(next(iter(gpu.memo)))
        _MEMOIZED.add(gpu)
    return kernel


def _lookup(problem, checks, cache_dir, gpu: Gpu, portable, estimate_s) -> Kernel:
    limits = portable_limits(gpu.limits) if portable else gpu.limits
    stores = _stores(gpu, cache_dir)
    entry = _cached(problem, checks, stores, _serves(limits, problem, gpu, portable))
    if entry is not None:
        source = "estimated" if entry.estimated else "exact"
        return Kernel(problem, entry.config, source, checks=checks, gpu=gpu, entry=entry)
    check_runnable(problem, limits, BUILT_IN)
    reference = Reference(problem)  # one set of data for every kernel tried below
    estimated = _estimate(problem, checks, stores, gpu, limits, reference, portable, estimate_s)
    return estimated or default_kernel(problem, gpu, checks, limits, reference)


def forget() -> None:
    """Drop memoized lookups (after a tune wrote new entries)."""
    with _MEMO_LOCK:
        _FORGOTTEN[0] += 1
        for gpu in list(_MEMOIZED):
            gpu.memo.clear()


def lookup(
    M: int,
    N: int,
    K: int,
    dtype: str = "f32",
    *,
    layout: str = "nn",
    batch: int = 1,
    shared_b: bool = False,
    epilogue: str | list | None = "none",
    accumulate: str = "auto",
    weights: str = "none",
    activations: str = "none",
    checks: bool = True,
    cache_dir: str | Path | None = None,
    gpu: Gpu | None = None,
    portable: bool = False,
    estimate: bool = True,
    device: wgpu.GPUDevice | None = None,
) -> Kernel:
    """The best known kernel for C = A @ B with A of M x K and B of K x N, on this device.

    The variant (see autotune.Problem): `layout` "nn", "nt" (B stored N x K), "tn", "tt";
    `batch` matrices per operand (`shared_b`: one B for all); `epilogue`, e.g.
    "bias,gelu" or "alpha,beta,bias,relu"; `accumulate` (f16) "auto", "f32" or "f16";
    `weights` "q8", "q4g32", "q4g128z"... for a weight quantized by autotune.quantize
    (layout "nt"; docs/QUANTIZED.md), and with such a weight `activations` "q8" to have the
    kernel quantize A's rows to int8 too and sum in integers. `portable` keeps to configs
    within WebGPU's default limits (for export).

    Without an entry for this problem, the configs ranked fastest by predicted time are
    verified and timed here back to back (ESTIMATE_S; 2-7 s in all on the H200), and
    the fastest is cached as `estimated`;
    `estimate=False` serves the first ranked config that verifies, untimed ("predicted"):
    for shapes that change on every call (a growing sequence), or round M up to a few
    sizes. A cache file keeps its newest cache.MAX_ESTIMATES estimates.
    `kernel.source` says which ("exact", "estimated", "predicted", "default"; see
    autotune.Kernel); call the kernel with NumPy arrays, or record it on GPU buffers
    with `kernel.encode`.

    `device`: a wgpu.GPUDevice of the caller's: only configs within its limits and
    features are served, from the cache file of its adapter, compiled on it (with
    `checks=False`, as always, without runtime checks); `kernel.encode` then records
    into its encoders. A device of lower limits or fewer kernel features than its
    adapter's keeps its estimates (and tuned entries) in slots of its own.
    """
    problem = Problem(
        M, N, K, dtype, layout, batch, shared_b, epilogue, accumulate, weights, activations
    )
    checks, portable = check_flag("checks", checks), check_flag("portable", portable)
    estimate_s = ESTIMATE_S if check_flag("estimate", estimate) else 0.0
    check_folder("cache_dir", cache_dir, writable=False)
    gpu = given_gpu(gpu, device, ArgumentError) or get_gpu()
    check_fits(problem, gpu, portable_limits(gpu.limits) if portable else None)
    folder = str(cache_dir) if cache_dir else None
    kernel = _memoized(problem, bool(checks), folder, gpu, bool(portable), estimate_s)
    if kernel.entry is not None and not cache.is_current(kernel.entry):
        # its template changed since it was looked up: never served, look again
        forget()
        kernel = _memoized(problem, bool(checks), folder, gpu, bool(portable), estimate_s)
    return kernel


def matmul(
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray | None = None,
    *,
    bias: np.ndarray | None = None,
    activation: str | None = None,
    alpha: float = 1.0,
    beta: float | None = None,
    trans_a: bool = False,
    trans_b: bool = False,
    accumulate: str = "auto",
    activations: str = "none",
    checks: bool = True,
    estimate: bool = True,
    device: wgpu.GPUDevice | None = None,
) -> np.ndarray:
    """activation(alpha * op(A) @ op(B) + beta * C + bias) on the GPU with the best known
    kernel for the problem; returns a new array (C is read, not written).

    trans_b=True: B is stored N x K (a linear layer's weight, y = x @ W.T); trans_a=True:
    A is stored K x M. B may be an autotune.QuantizedWeight (y = x @ W.T with W its
    dequantized weight; activations="q8" quantizes x's rows to int8
    too, as quantize.quantize_activations, and sums in integers). A 3-D A is a batch,
    with a 3-D B (one per item) or a 2-D B (shared).
    f16 arrays run in f16 (the adapter needs shader-f16), accumulating in whichever type
    was fastest when tuned, or as `accumulate` ("f32", "f16") says. `estimate`: as in
    lookup (False: a new shape costs no timing and writes nothing to the cache).
    `device`: a wgpu.GPUDevice of the caller's to run on (as in lookup).
    """
    if C is not None and beta is None:  # (C alone was dropped without a word before)
        raise ProblemError("beta", "C is given without beta: pass beta (C = alpha A B + beta C)")
    beta = 0.0 if beta is None else beta
    arrays, problem = check_operands(
        A,
        B,
        trans_a=trans_a,
        trans_b=trans_b,
        C=C,
        bias=bias,
        alpha=alpha,
        beta=beta,
        activation=activation,
    )
    if "beta" not in problem.ops:  # beta = 0 reads no C (as BLAS): the kernel binds none
        arrays.pop("C", None)
    checks = check_flag("checks", checks)
    kernel = lookup(
        **(problem.arguments | {"accumulate": accumulate, "activations": activations}),
        checks=checks,
        estimate=estimate,
        device=device,
    )
    return kernel(
        arrays["A"],
        arrays["B"],
        arrays.get("C"),
        bias=arrays.get("bias"),
        alpha=alpha,
        beta=beta,
    )
