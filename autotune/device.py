"""The GPU: adapter choice, device, limits, features, fingerprint, shader modules.

Everything that talks to wgpu's adapter/device objects directly lives here, so the rest
of the pipeline sees one small `Gpu` object. Set AUTOTUNE_ADAPTER to a word of an
adapter's name or backend ("vulkan", "llvmpipe", "nvidia", "opengl"), an index in the
list of adapters (`1`), or both (`nvidia:1`, the second adapter whose name has "nvidia")
to pick another adapter than wgpu's high-performance choice; `python -m autotune devices`
lists them with their indices. Identical GPUs (a server's eight) have one fingerprint, so
an index is what tells them apart: a worker process opens its adapter by index and
checks the fingerprint there.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

# Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid" on every adapter probe
# when the variable is unset (servers, CI); give them a private folder so they stay quiet.
if not os.environ.get("XDG_RUNTIME_DIR"):
    _runtime = f"/tmp/autotune-runtime-{os.getuid()}" if hasattr(os, "getuid") else ""
    if _runtime:
        os.makedirs(_runtime, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = _runtime

import wgpu  # noqa: E402
from wgpu.backends.wgpu_native import _api as native  # noqa: E402

from .arguments import ArgumentError, is_integer, shown  # noqa: E402

# The limits a GEMM kernel can run into; the device is requested with the adapter's
# real values for these (wgpu would otherwise give WebGPU's small defaults).
COMPUTE_LIMITS = (
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffer-binding-size",
    "max-buffer-size",
    "max-storage-buffers-per-shader-stage",
)

# WebGPU's default limits: what a browser grants without asking (export --portable).
WEBGPU_DEFAULT_LIMITS = {
    "max-compute-workgroup-storage-size": 16384,
    "max-compute-invocations-per-workgroup": 256,
    "max-compute-workgroup-size-x": 256,
    "max-compute-workgroup-size-y": 256,
    "max-compute-workgroup-size-z": 64,
    "max-compute-workgroups-per-dimension": 65535,
    "max-storage-buffer-binding-size": 134217728,
    "max-buffer-size": 268435456,
    "max-storage-buffers-per-shader-stage": 8,
}


def compute_limits(adapter_or_device) -> dict[str, int]:
    """The COMPUTE_LIMITS of a wgpu adapter or device, as ints."""
    return {name: int(adapter_or_device.limits[name]) for name in COMPUTE_LIMITS}


def portable_limits(limits: dict) -> dict:
    """The limits a kernel must fit to run anywhere WebGPU runs: the smaller of the
    device's and WebGPU's defaults (what a browser grants without asking)."""
    return {name: min(int(value), WEBGPU_DEFAULT_LIMITS[name]) for name, value in limits.items()}


# Optional features we ask for when the adapter has them (wgpu-py's names).
WANTED_FEATURES = ("timestamp-query", "shader-f16", "subgroup")
# The WGSL `enable` extensions our templates use, and the WebGPU device feature each
# needs, by WebGPU's name (a browser's, and the export manifest's). A kernel declares
# what it needs by its `enable` lines, the one place that fact lives.
ENABLE_FEATURES = {"f16": "shader-f16", "subgroups": "subgroups"}
_WGPU_NAMES = {"subgroups": "subgroup"}  # where wgpu-py's name differs
KERNEL_FEATURES = frozenset(_WGPU_NAMES.get(f, f) for f in ENABLE_FEATURES.values())
# naga (wgpu-native 29) implements subgroup operations behind the device feature but
# refuses the standard `enable subgroups;` directive ("not yet implemented in Naga"),
# which browsers require: our shaders carry it, and it is removed for naga alone.
_NAGA_REFUSES = re.compile(r"^enable subgroups;\n", re.MULTILINE)
_ENABLE = re.compile(r"(?:\s|//[^\n]*\n)*enable\s+([^;]*);")  # after any comment lines


def required_features(wgsl: str) -> tuple[str, ...]:
    """The WebGPU features `wgsl` needs: those of its leading `enable` directives."""
    features, position = [], 0
    while match := _ENABLE.match(wgsl, position):
        for extension in match[1].split(","):
            feature = ENABLE_FEATURES.get(extension.strip())
            if feature and feature not in features:
                features.append(feature)
        position = match.end()
    return tuple(features)


ADAPTER_ENV = "AUTOTUNE_ADAPTER"


class NoAdapterError(RuntimeError):
    """No wgpu adapter (or none matching AUTOTUNE_ADAPTER) exists on this machine."""


class AdapterError(ArgumentError, NoAdapterError):
    """A bad adapter choice (`field`: "adapter", or AUTOTUNE_ADAPTER when it came from the
    environment): not a word, an index or word:index, or matching no adapter here."""


@dataclass(frozen=True)
class AdapterChoice:
    """Which adapter: the `index`-th of those whose name or backend has `word` (any
    adapter without a word; the first without an index). Neither: wgpu's own choice."""

    word: str = ""
    index: int | None = None

    @classmethod
    def parse(cls, value: object, field: str = "adapter") -> AdapterChoice:
        """An index (1 or "1"), a word ("nvidia") or word:index ("nvidia:1"); "" or None:
        wgpu's high-performance choice. AdapterError names `field`."""
        if value is None:
            return cls()
        if is_integer(value) and value >= 0:
            return cls(index=int(value))
        text = value.strip().lower() if isinstance(value, str) else None
        word, _, index = (text or "").rpartition(":") if text and ":" in text else (text, "", "")
        bad = text is None or (":" in text and not (word and index.isdigit()))
        if bad or ":" in word or (word.isdigit() and index):  # ("1:2": an index, then one)
            raise AdapterError(
                field,
                f"{field} must be an index (1), a word of an adapter's name (nvidia) or "
                f"word:index (nvidia:1), got {shown(value)}",
            )
        if word.isdigit() and not index:
            return cls(index=int(word))
        return cls(word, int(index) if index else None)

    def __str__(self) -> str:
        if self.word:
            return self.word if self.index is None else f"{self.word}:{self.index}"
        return "" if self.index is None else str(self.index)

    def matches(self, adapter: wgpu.GPUAdapter) -> bool:
        word = self.word
        return not word or word in adapter.summary.lower() or word == _backend(adapter).lower()


def _backend(adapter: wgpu.GPUAdapter) -> str:
    return str(adapter.info["backend_type"])


@dataclass(frozen=True)
class Fingerprint:
    """What identifies a GPU + driver for caching: a change in any field is a new device."""

    backend: str
    vendor: str
    device: str
    description: str  # the driver's own description, e.g. "Mesa 22.3.6 (LLVM 15.0.6)"
    vendor_id: int
    device_id: int
    adapter_type: str

    @classmethod
    def of(cls, adapter: wgpu.GPUAdapter) -> Fingerprint:
        info = adapter.info
        return cls(
            backend=str(info["backend_type"]),
            vendor=str(info["vendor"]),
            device=str(info["device"]),
            description=str(info["description"]),
            vendor_id=int(info["vendor_id"]),
            device_id=int(info["device_id"]),
            adapter_type=str(info["adapter_type"]),
        )

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def slug(self) -> str:
        """A short file-name-safe name: vendor-device-backend."""
        text = f"{self.device}-{self.backend}".lower()
        return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:80]


def one_line(text: str) -> str:
    """`text` with every run of whitespace, line breaks and other unprintable characters
    (a driver's strings may hold any) made one space."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def versions() -> dict:
    """The software versions that can change a kernel's speed or validity."""
    from wgpu.backends.wgpu_native import __version__ as native_version

    return {"wgpu": wgpu.__version__, "wgpu_native": native_version}


def list_adapters() -> list[wgpu.GPUAdapter]:
    return list(wgpu.gpu.enumerate_adapters_sync())


def adapters_text(adapters: list[wgpu.GPUAdapter]) -> str:
    """The adapters with their indices, on one line (for messages)."""
    return "; ".join(f"{i}: {one_line(a.summary)}" for i, a in enumerate(adapters)) or "none"


def choose_adapter(
    choice: AdapterChoice, field: str = "adapter"
) -> tuple[wgpu.GPUAdapter, int | None]:
    """The adapter `choice` names and its index in list_adapters() (None for wgpu's own
    choice, which it does not say); AdapterError (naming `field`) when none matches."""
    if choice == AdapterChoice():
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise NoAdapterError("no wgpu adapter found (install mesa-vulkan-drivers)")
        return adapter, None
    adapters = list_adapters()
    matching = [i for i, adapter in enumerate(adapters) if choice.matches(adapter)]
    position = choice.index or 0
    if position < len(matching):
        return adapters[matching[position]], matching[position]
    if choice.word and not matching:
        why = "matches no adapter"
    elif choice.word:
        why = f"is out of range: {len(matching)} adapter(s) match {choice.word!r}"
    else:
        why = f"is out of range: there are {len(adapters)} adapter(s)"
    raise AdapterError(field, f"{field} {str(choice)!r} {why}; adapters: {adapters_text(adapters)}")


class Gpu:
    """One adapter and a device on it: the device requested here with the adapter's real
    compute limits, or a device the caller already has (`device`), with its own limits
    and features, which may be lower than the adapter's."""

    def __init__(
        self,
        adapter: wgpu.GPUAdapter,
        device: wgpu.GPUDevice | None = None,
        features: frozenset[str] | None = None,
        index: int | None = None,
    ):
        """`device`: the caller's, as it is; else one requested here with the adapter's
        compute limits and its WANTED_FEATURES, or only those of `features` (a worker
        measuring for a caller's device). `index`: the adapter's in list_adapters(),
        where known (what a worker opens: identical GPUs share a fingerprint)."""
        self.adapter = adapter
        self.index = index
        self.fingerprint = Fingerprint.of(adapter)  # the cache file: the adapter's, either way
        have = device or adapter
        self.features = frozenset(f for f in WANTED_FEATURES if f in have.features)
        if features is not None:  # (timestamps are for measuring: always the adapter's)
            self.features -= KERNEL_FEATURES - frozenset(features)
        self.limits = compute_limits(have)
        self.device = device or adapter.request_device_sync(
            required_features=sorted(self.features), required_limits=dict(self.limits)
        )
        self.queue = self.device.queue
        self.memo: dict = {}  # lookup's kernels on this device, most recently used last
        self.caller = device is not None  # a device the caller requested, not this class

    @property
    def kernel_features(self) -> frozenset[str]:
        """Its features that a kernel can need (wgpu-py's names)."""
        return self.features & KERNEL_FEATURES

    def limited_as(self, portable: bool = False) -> str | None:
        """The digest that names this device's own cache space (key.Key.of's `limited`)
        where what it can run is less than its adapter's: lower limits or fewer kernel
        features (with `portable`, below WebGPU's defaults as well); else None. Devices
        that run the same kernels share it (timestamps are not part of it)."""
        adapter, mine = compute_limits(self.adapter), self.limits
        if portable:
            adapter, mine = portable_limits(adapter), portable_limits(mine)
        fewer = not self.kernel_features >= KERNEL_FEATURES & self.adapter.features
        if not fewer and all(mine[name] >= adapter[name] for name in mine):
            return None
        text = json.dumps([bool(portable), sorted(mine.items()), sorted(self.kernel_features)])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def has_feature(self, feature: str) -> bool:
        """Whether this device has the WebGPU feature `feature` (WebGPU's name)."""
        return _WGPU_NAMES.get(feature, feature) in self.features

    @property
    def has_every_feature(self) -> bool:
        """Whether it has every feature a template can ask for (ENABLE_FEATURES)."""
        return all(self.has_feature(f) for f in ENABLE_FEATURES.values())

    def lacks(self, features) -> tuple[str, ...]:
        """Those of `features` (WebGPU's names) this device does not have."""
        return tuple(f for f in features if not self.has_feature(f))

    @property
    def described(self) -> str:
        """The device in error messages: a caller's is named as the one they gave."""
        if self.caller:
            return f"the wgpu.GPUDevice given (on {self.summary}; see its required_features)"
        return self.summary

    @property
    def has_timestamps(self) -> bool:
        return "timestamp-query" in self.features

    @property
    def timestamp_period_ns(self) -> float:
        """Nanoseconds per timestamp tick (1.0 on most drivers)."""
        return float(native.lib.wgpuQueueGetTimestampPeriod(self.queue._internal))

    def wait_idle(self) -> None:
        """Block until all submitted GPU work is done.

        (wgpu-py 0.32's queue.on_submitted_work_done_sync breaks on wgpu-native 29's
        callback signature; wgpuDevicePoll with wait=true does the same job.)
        """
        native.libf.wgpuDevicePoll(self.device._internal, True, native.ffi.NULL)

    @property
    def summary(self) -> str:
        """The adapter in words, on one line (it goes into messages and file comments)."""
        return one_line(self.adapter.summary)

    def create_shader_module(self, code: str, *, checks: bool = True, label: str = ""):
        """Compile WGSL, with wgpu's runtime checks (as browsers do) or without them.

        Without checks, wgpu-native's `wgpuDeviceCreateShaderModuleTrusted` skips the
        bounds checks on every array index and the loop bounding that naga inserts;
        FACTS.md measured them at ~30% of a tuned kernel's time on the H200. Our
        templates guard every access themselves, which is what makes that sound.
        """
        code = _NAGA_REFUSES.sub("", code, count=1)  # that line only: the rest as written
        if checks:
            return self.device.create_shader_module(code=code, label=label)
        source = native.new_struct_p("WGPUShaderSourceWGSL *", code=native.to_c_string_view(code))
        source[0].chain.next = native.ffi.NULL
        source[0].chain.sType = native.lib.WGPUSType_ShaderSourceWGSL
        descriptor = native.new_struct_p(
            "WGPUShaderModuleDescriptor *",
            nextInChain=native.ffi.cast("WGPUChainedStruct *", source),
            label=native.to_c_string_view(label),
        )
        no_checks = 0  # WGPUShaderRuntimeChecks_None
        handle = native.libf.wgpuDeviceCreateShaderModuleTrusted(
            self.device._internal, descriptor, no_checks
        )
        if handle == native.ffi.NULL:
            raise RuntimeError("Shader module creation failed")
        return native.GPUShaderModule(label, handle, self.device)


def adapter_index(gpu: Gpu, adapters: list[wgpu.GPUAdapter]) -> int | None:
    """`gpu`'s adapter's index in `adapters` (list_adapters()): its own where known,
    else the first with its fingerprint (the one a worker opens by fingerprint alone)."""
    if gpu.index is not None:
        return gpu.index
    same = (i for i, adapter in enumerate(adapters) if Fingerprint.of(adapter) == gpu.fingerprint)
    return next(same, None)


@functools.cache
def _gpu_for(choice: AdapterChoice, field: str) -> Gpu:
    adapter, index = choose_adapter(choice, field)
    return Gpu(adapter) if index is None else _gpu_of_index(index, adapter)


_INDEXED: dict[int, Gpu] = {}  # one Gpu per adapter, however it was named


def _gpu_of_index(index: int, adapter: wgpu.GPUAdapter) -> Gpu:
    if index not in _INDEXED:
        _INDEXED[index] = Gpu(adapter, index=index)
    return _INDEXED[index]


def get_gpu() -> Gpu:
    """The process-wide Gpu for the current AUTOTUNE_ADAPTER choice (created once)."""
    choice = AdapterChoice.parse(os.environ.get(ADAPTER_ENV, ""), ADAPTER_ENV)
    return _gpu_for(choice, ADAPTER_ENV)


def gpu_at(adapter: object) -> Gpu:
    """The Gpu of the adapter an index, word or word:index names (`adapter`, as in
    AUTOTUNE_ADAPTER; created once per adapter); None or "": get_gpu()'s."""
    choice = AdapterChoice.parse(adapter, "adapter")
    return get_gpu() if choice == AdapterChoice() else _gpu_for(choice, "adapter")


# The attribute of a caller's wgpu.GPUDevice that holds its Gpu: made once per device,
# with lookup's memo of kernels on it, all collected with the device (a cycle).
_GPU_ATTRIBUTE = "_autotune_gpu"


def gpu_of(device: object, error=ValueError) -> Gpu:
    """The Gpu of a wgpu.GPUDevice the caller already has; `error(field, message)`
    (an ArgumentError class) refuses anything else."""
    if not isinstance(device, wgpu.GPUDevice):
        raise error("device", f"device must be a wgpu.GPUDevice, got {type(device).__name__}")
    if getattr(device, _GPU_ATTRIBUTE, None) is None:
        setattr(device, _GPU_ATTRIBUTE, Gpu(device.adapter, device))
    return getattr(device, _GPU_ATTRIBUTE)


def given_gpu(gpu: object, device: object, error=ValueError) -> Gpu | None:
    """The Gpu a call was given: `gpu` (an autotune.Gpu) or the Gpu of the caller's
    wgpu.GPUDevice `device`, not both; None when neither (the process-wide one then)."""
    if gpu is not None and not isinstance(gpu, Gpu):
        raise error("gpu", f"gpu must be an autotune.Gpu or None, got {type(gpu).__name__}")
    if device is None:
        return gpu
    if gpu is not None:
        raise error("device", "give gpu or device, not both")
    return gpu_of(device, error)


def gpu_matching(fingerprint: dict | None, features=None, index: int | None = None) -> Gpu:
    """A Gpu of its own on the adapter with this fingerprint (the tuner's, whose device
    may be a caller's), with only `features` where given (the caller's device's);
    get_gpu()'s when none is given. Two identical GPUs have one fingerprint: `index`
    (in list_adapters()) says which, else the first of them is taken."""
    if fingerprint is None and features is None and index is None:
        return get_gpu()
    wanted = Fingerprint(**fingerprint) if fingerprint else get_gpu().fingerprint
    return _gpu_of_adapter(wanted, None if features is None else frozenset(features), index)


@functools.cache
def _gpu_of_adapter(fingerprint: Fingerprint, features: frozenset | None, index: int | None) -> Gpu:
    adapters = list_adapters()
    if index is not None:
        if index < len(adapters) and Fingerprint.of(adapters[index]) == fingerprint:
            return Gpu(adapters[index], features=features, index=index)
        raise NoAdapterError(
            f"adapter {index} here is not {fingerprint.device!r} ({fingerprint.backend}); "
            f"adapters: {adapters_text(adapters)}"
        )
    for position, adapter in enumerate(adapters):
        if Fingerprint.of(adapter) == fingerprint:
            return Gpu(adapter, features=features, index=position)
    raise NoAdapterError(f"no adapter here is {fingerprint.device!r} ({fingerprint.backend})")


def has_adapter() -> bool:
    """True when a usable adapter exists; tests use it to skip cleanly."""
    try:
        get_gpu()
    except Exception:
        return False
    return True
