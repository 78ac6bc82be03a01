"""Kernels on the caller's own wgpu device and buffers: lookup(device=), kernel.encode into
the caller's command encoder (buffers at offsets, every pass of the plan), set_scalars,
buffer_sizes, and each wrong buffer refused before anything is recorded."""

import gc
import weakref

import numpy as np
import pytest
import wgpu
from entries import seed_entry

import autotune
from autotune import cache
from autotune.device import gpu_of, versions
from autotune.kernel import Kernel
from autotune.problem import Problem
from autotune.space import load_space

USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
# what a device requested with WebGPU's defaults, lowered further: 64 invocations
LOW_LIMITS = {
    "max-compute-invocations-per-workgroup": 64,
    "max-compute-workgroup-size-x": 64,
    "max-compute-workgroup-size-y": 64,
    "max-compute-workgroup-storage-size": 8192,
}


@pytest.fixture(scope="module")
def device(gpu):
    """A device of the caller's own on the tests' adapter, as wgpu-py requests one without
    arguments: the adapter's limits, no optional feature."""
    return gpu.adapter.request_device_sync()


@pytest.fixture(scope="module")
def low_device(gpu):
    return gpu.adapter.request_device_sync(required_limits=LOW_LIMITS)


def upload(device, array: np.ndarray, offset: int = 0, size: int | None = None):
    buffer = device.create_buffer(size=size or offset + array.nbytes, usage=USAGE)
    device.queue.write_buffer(buffer, offset, np.ascontiguousarray(array))
    return buffer


def download(device, buffer, shape, dtype=np.float32, offset: int = 0) -> np.ndarray:
    data = np.frombuffer(device.queue.read_buffer(buffer, offset), dtype)
    return data[: np.prod(shape)].reshape(shape)


def close(got, want, dtype=np.float32):
    scale = np.abs(want).max() or 1.0
    return np.abs(got - want).max() <= 1e-4 * scale * (10 if dtype == np.float16 else 1)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def test_encode_on_the_callers_buffers_at_offsets(device, tmp_path):
    rng = np.random.default_rng(1)
    A = rng.standard_normal((24, 40), dtype=np.float32)
    W = rng.standard_normal((36, 40), dtype=np.float32)  # B stored N x K
    kernel = autotune.lookup(24, 36, 40, layout="nt", device=device, cache_dir=tmp_path)
    assert kernel.gpu.device is device
    sizes = kernel.buffer_sizes()
    assert sizes == {"A": A.nbytes, "B": W.nbytes, "C": 24 * 36 * 4}
    at = 2 * device.limits["min-storage-buffer-offset-alignment"]
    a, b = upload(device, A, offset=at), upload(device, W, offset=at)
    c = upload(device, np.full(at // 4 + 24 * 36 + 8, np.nan, np.float32))  # poisoned
    encoder = device.create_command_encoder()
    kernel.encode(encoder, (a, at), (b, at), (c, at))
    device.queue.submit([encoder.finish()])
    assert close(download(device, c, (24, 36), offset=at), A.astype(np.float64) @ W.T)
    around = download(device, c, (at // 4 + 24 * 36 + 8,))
    assert np.isnan(around[: at // 4]).all() and np.isnan(around[-8:]).all()  # C's range only


def test_three_gemms_chained_without_reading_back(device, tmp_path):
    """An MLP, y = (gelu(gelu(x W1^T + b1) W2^T + b2)) W3^T + b3, recorded into one encoder."""
    rng = np.random.default_rng(2)
    sizes = [32, 48, 40, 24]  # widths: in, two hidden, out
    x = rng.standard_normal((8, sizes[0]), dtype=np.float32)
    weights = [
        (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        for k, n in zip(sizes, sizes[1:], strict=False)
    ]
    biases = [rng.standard_normal(n, dtype=np.float32) for n in sizes[1:]]
    activations = ["bias,gelu", "bias,gelu", "bias"]
    buffers = [upload(device, x)]
    encoder = device.create_command_encoder()
    for W, b, epilogue in zip(weights, biases, activations, strict=True):
        n, k = W.shape
        kernel = autotune.lookup(
            8, n, k, layout="nt", epilogue=epilogue, device=device, cache_dir=tmp_path
        )
        out = device.create_buffer(size=kernel.buffer_sizes()["C"], usage=USAGE)
        kernel.encode(encoder, buffers[-1], upload(device, W), out, bias=upload(device, b))
        buffers.append(out)
    device.queue.submit([encoder.finish()])
    want = x.astype(np.float64)
    for W, b, epilogue in zip(weights, biases, activations, strict=True):
        want = want @ W.T + b
        want = gelu(want) if "gelu" in epilogue else want
    assert close(download(device, buffers[-1], want.shape), want)


def test_a_device_with_lower_limits_gets_a_config_within_them(low_device, tmp_path):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((64, 96), dtype=np.float32)
    B = rng.standard_normal((96, 80), dtype=np.float32)
    kernel = autotune.lookup(64, 80, 96, device=low_device, cache_dir=tmp_path)
    needs = kernel.shader.plan.needs()
    assert needs["max-compute-invocations-per-workgroup"] <= 64
    assert needs["max-compute-workgroup-storage-size"] <= 8192
    assert close(kernel(A, B), A.astype(np.float64) @ B)
    result = autotune.matmul(A, B, device=low_device)
    assert close(result, A.astype(np.float64) @ B)


def test_split_k_records_both_passes_on_its_own_workspace(gpu, device):
    """A kernel of two passes: the partial products into the workspace the kernel owns,
    then the reduction into the caller's C."""
    problem = Problem(8, 16, 2048)
    config = load_space("splitk").seed_configs(problem, autotune.get_gpu().limits)[0]
    kernel = Kernel(problem, config, "default", gpu=gpu_of(device))
    assert len(kernel.shader.plan.passes) == 2 and kernel.shader.plan.workspaces
    rng = np.random.default_rng(4)
    A = rng.standard_normal((8, 2048), dtype=np.float32)
    B = rng.standard_normal((2048, 16), dtype=np.float32)
    c = upload(device, np.full((8, 16), np.nan, np.float32))
    encoder = device.create_command_encoder()
    kernel.encode(encoder, upload(device, A), upload(device, B), c)
    device.queue.submit([encoder.finish()])
    assert close(download(device, c, (8, 16)), A.astype(np.float64) @ B)


def test_set_scalars_reaches_the_kernel(device, tmp_path):
    rng = np.random.default_rng(5)
    A = rng.standard_normal((16, 24), dtype=np.float32)
    B = rng.standard_normal((24, 20), dtype=np.float32)
    C = rng.standard_normal((16, 20), dtype=np.float32)
    kernel = autotune.lookup(16, 20, 24, epilogue="alpha,beta", device=device, cache_dir=tmp_path)
    c = upload(device, C)
    kernel.set_scalars(alpha=0.5, beta=-2.0)
    encoder = device.create_command_encoder()
    kernel.encode(encoder, upload(device, A), upload(device, B), c)
    device.queue.submit([encoder.finish()])
    assert close(download(device, c, C.shape), 0.5 * (A.astype(np.float64) @ B) - 2.0 * C)


def test_scalars_the_epilogue_lacks_are_refused(device, tmp_path):
    kernel = autotune.lookup(16, 20, 24, device=device, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="no alpha") as error:
        kernel.set_scalars(alpha=2.0)
    assert error.value.field == "alpha"
    kernel.set_scalars(alpha=1.0, beta=0.0)  # the values it computes: accepted
    with pytest.raises(ValueError, match="finite"):
        kernel.set_scalars(alpha=float("nan"))


def _bad_operands(device, kernel, gpu):
    """(field, what the message says, the encode arguments) for each wrong buffer."""
    sizes = kernel.buffer_sizes()
    a, b, c = (device.create_buffer(size=sizes[n], usage=USAGE) for n in "ABC")
    elsewhere = gpu.device.create_buffer(size=sizes["B"], usage=USAGE)
    copy_only = device.create_buffer(size=sizes["B"], usage=wgpu.BufferUsage.COPY_DST)
    alignment = device.limits["min-storage-buffer-offset-alignment"]
    return [
        ("B", "GPUBuffer", (a, np.zeros(4, np.float32), c)),
        ("B", "another device", (a, elsewhere, c)),
        ("B", "STORAGE", (a, copy_only, c)),
        ("C", "bytes", (a, b, device.create_buffer(size=sizes["C"] - 4, usage=USAGE))),
        ("A", "bytes", (upload(device, np.zeros(8, np.float32)), b, c)),
        ("A", "multiple", ((a, alignment // 2), b, c)),
        ("A", "bytes", ((a, alignment), b, c)),  # the buffer is exactly A: no room past it
        ("C", "one buffer", (a, b, a)),
    ]


def test_each_wrong_buffer_is_refused_before_recording(gpu, device, tmp_path):
    kernel = autotune.lookup(16, 20, 24, device=device, cache_dir=tmp_path)
    for field, says, operands in _bad_operands(device, kernel, gpu):
        encoder = device.create_command_encoder()
        with pytest.raises(ValueError, match=says) as error:
            kernel.encode(encoder, *operands)
        assert error.value.field == field, says
        encoder.finish()  # nothing was recorded: the encoder is still valid
    a, b, c = (device.create_buffer(size=s, usage=USAGE) for s in kernel.buffer_sizes().values())
    with pytest.raises(ValueError, match="another device") as error:
        kernel.encode(gpu.device.create_command_encoder(), a, b, c)
    assert error.value.field == "encoder"
    with pytest.raises(ValueError, match="no bias"):
        kernel.encode(device.create_command_encoder(), a, b, c, bias=a)
    with_bias = autotune.lookup(16, 20, 24, epilogue="bias", device=device, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="bias is missing"):
        with_bias.encode(device.create_command_encoder(), a, b, c)


def test_device_and_gpu_arguments_are_checked(gpu, device):
    with pytest.raises(ValueError, match="wgpu.GPUDevice") as error:
        autotune.lookup(16, 16, 16, device="cuda:0")
    assert error.value.field == "device"
    with pytest.raises(ValueError, match="not both"):
        autotune.lookup(16, 16, 16, device=device, gpu=gpu)


@pytest.mark.slow
def test_tuning_for_a_device_with_lower_limits_keeps_within_them(gpu, low_device, tmp_path):
    """The adapter's faster entry of the shape needs 256 invocations: the device's tune
    keeps its own best in its own slot, timed by the adapter's timestamps."""
    problem = Problem(64, 64, 64)
    _cache_with(gpu, tmp_path, problem, load_space("blocked").seed_configs(problem)[0])
    result = autotune.tune(
        64, 64, 64, trials=4, device=low_device, cache_dir=tmp_path, templates=["blocked"]
    )
    assert result.entry is not None and result.entry.key.space.startswith("limited-")
    if gpu.has_timestamps:  # the device was requested without timestamp-query
        assert result.entry.method == "timestamp"
    needs = load_space("blocked").plan(result.entry.config, result.problem).needs()
    assert needs["max-compute-invocations-per-workgroup"] <= 64
    kernel = autotune.lookup(64, 64, 64, device=low_device, cache_dir=tmp_path)
    assert kernel.source == "exact" and kernel.config == result.entry.config


def _cache_with(gpu, folder, problem, config, estimated=False):
    store = cache.DeviceCache(folder, gpu.fingerprint.as_dict(), versions())
    store.put(seed_entry(problem, config=config, median_s=1e-9, estimated=estimated))
    return store


def test_a_cached_config_over_the_devices_limits_is_not_served(gpu, low_device, tmp_path):
    """The fastest tuned entry of the shape needs 256 invocations: a device of 64 gets a
    config within its limits; the adapter's own device gets the entry."""
    problem = Problem(64, 64, 64)
    config = load_space("blocked").seed_configs(problem)[0]
    assert load_space("blocked").plan(config, problem).needs()[
        "max-compute-invocations-per-workgroup"] > 64  # fmt: skip
    _cache_with(gpu, tmp_path, problem, config)
    assert autotune.lookup(64, 64, 64, gpu=gpu, cache_dir=tmp_path).source == "exact"
    kernel = autotune.lookup(64, 64, 64, device=low_device, cache_dir=tmp_path)
    assert kernel.source != "exact" and kernel.config != config
    assert kernel.shader.plan.needs()["max-compute-invocations-per-workgroup"] <= 64


def test_a_kernel_needing_a_feature_the_device_lacks_is_not_served(gpu, device, tmp_path):
    """A subgroup decode kernel is tuned for the shape; the caller's device was requested
    without the subgroup feature: it is served a kernel without subgroup operations."""
    if not gpu.has_feature("subgroups"):
        pytest.skip("the adapter has no subgroups")
    problem = Problem(1, 256, 256, layout="nt")
    config = next(c for c in load_space("gemv").seed_configs(problem) if c.as_dict()["SG"])
    _cache_with(gpu, tmp_path, problem, config)
    assert autotune.lookup(1, 256, 256, layout="nt", gpu=gpu, cache_dir=tmp_path).config == config
    kernel = autotune.lookup(1, 256, 256, layout="nt", device=device, cache_dir=tmp_path)
    assert kernel.config != config and "subgroup" not in kernel.wgsl
    A = np.ones((1, 256), np.float32)
    assert close(kernel(A, np.ones((256, 256), np.float32)), np.full((1, 256), 256.0))


def test_a_missing_feature_is_named_as_the_devices(device):
    with pytest.raises(ValueError, match="wgpu.GPUDevice given") as error:
        autotune.lookup(8, 8, 8, "f16", device=device)
    assert error.value.field == "dtype"


def test_a_device_of_lower_limits_keeps_its_estimates_in_its_own_slots(gpu, tmp_path):
    """What suits 256 invocations is kept for that device, in a space of its own: the
    adapter's own lookup makes its own estimate rather than being served that one."""
    limits = {f"max-compute-{n}": 256 for n in ("invocations-per-workgroup", "workgroup-size-x")}
    mid = gpu.adapter.request_device_sync(required_features=sorted(gpu.features),
                                          required_limits=limits)  # fmt: skip
    kernel = autotune.lookup(40, 56, 72, device=mid, cache_dir=tmp_path)
    assert kernel.source == "estimated" and kernel.entry.key.space.startswith("limited-")
    again = autotune.lookup(40, 56, 72, device=mid, cache_dir=tmp_path, estimate=False)
    assert again.source == "estimated" and again.config == kernel.config  # from the file
    store = cache.DeviceCache(tmp_path, gpu.fingerprint.as_dict(), versions())
    assert [e.key.space for e in store.entries().values()] == [kernel.entry.key.space]
    own = autotune.lookup(40, 56, 72, gpu=gpu, cache_dir=tmp_path)
    assert own.source == "estimated" and own.entry.key.space == "device"


def test_the_callers_device_and_its_kernels_are_collected_with_it(gpu, tmp_path):
    device = gpu.adapter.request_device_sync()
    kernel = autotune.lookup(16, 20, 24, device=device, cache_dir=tmp_path)
    kernel.set_scalars()  # its uniform block on the device
    gone = weakref.ref(device)
    del device, kernel
    gc.collect()
    assert gone() is None


@pytest.mark.slow
def test_tuning_for_a_device_without_subgroups_measures_none(gpu, device, tmp_path):
    if not gpu.has_feature("subgroups"):
        pytest.skip("the adapter has no subgroups")
    result = autotune.tune(1, 256, 256, layout="nt", trials=6, templates=["gemv"],
                           device=device, cache_dir=tmp_path, sampler="random", seed=3)  # fmt: skip
    assert result.entry is not None and result.entry.config.as_dict()["SG"] == 0
    assert all(c.as_dict()["SG"] == 0 for c in result.search.finalists)
    assert not result.search.failures  # subgroup configs pruned, never paid for


def test_devices_that_run_the_same_kernels_share_their_space(gpu):
    """Timestamps are for measuring: a device with them and one without, of the same
    limits and kernel features, keep their entries in one space; portable is another."""
    limits = {"max-compute-invocations-per-workgroup": 256}
    kernel_features = sorted(gpu.kernel_features)
    timed = gpu.adapter.request_device_sync(
        required_features=sorted(gpu.features), required_limits=limits
    )
    untimed = gpu.adapter.request_device_sync(
        required_features=kernel_features, required_limits=limits
    )
    digest = gpu_of(timed).limited_as()
    assert digest and gpu_of(untimed).limited_as() == digest
    # 256 is WebGPU's default: within WebGPU's defaults it runs what the adapter runs
    assert gpu_of(timed).limited_as(portable=True) is None
    assert gpu.limited_as() is None and gpu.limited_as(portable=True) is None
    if gpu.kernel_features:  # a device requested without them: limited both ways
        bare = gpu_of(gpu.adapter.request_device_sync())
        assert None is not bare.limited_as(portable=True) != bare.limited_as() is not None


@pytest.mark.slow
def test_a_portable_tune_for_a_device_without_subgroups_keeps_to_its_own_space(
    gpu, device, tmp_path
):
    if not gpu.has_feature("subgroups"):
        pytest.skip("the adapter has no subgroups")
    result = autotune.tune(1, 256, 256, layout="nt", trials=3, templates=["gemv"],
                           portable=True, device=device, cache_dir=tmp_path)  # fmt: skip
    assert result.entry.key.space == f"limited-{gpu_of(device).limited_as(portable=True)}"
    own = autotune.lookup(1, 256, 256, layout="nt", portable=True, gpu=gpu, cache_dir=tmp_path)
    assert own.entry is None or not own.entry.key.space.startswith("limited-")
