"""Quantized weights: a linear layer's weight W (N x K, y = x @ W.T) in 8 or 4 bits.

    qw = autotune.quantize(W, bits=4, group=128)          # q4g128, f16 scales
    qw = autotune.quantize(W, bits=8)                     # q8, one scale per row
    qw.dequantize()                                       # float32 N x K
    qw.save("out/", "fc1"); autotune.QuantizedWeight.load("out/fc1.json")
    python -m autotune quantize W.npy --bits 4 --group 128 --out DIR

The format, byte for byte (docs/QUANTIZED.md has it with a worked example):

- K is padded with zeros to Kp: a multiple of 4 (q8) or of the group (4-bit). Padded
  elements hold the code of 0, so they dequantize to exactly 0.
- q8: one scale per row, s[n] >= max|W[n, :]| / 127; q = clamp(rint(W / s), -127, 127)
  (-128 never occurs); `data` is uint32 (N, Kp / 4): element k of row n is the
  two's-complement byte in bits 8 * (k % 4) of word [n, k // 4] (the operand layout of
  WGSL's dot4I8Packed; the little-endian bytes are the int8 row).
- 4-bit: one scale per group of G consecutive K of a row, `scales` (N, Kp / G). Without
  zero points (q4gG) s >= max|w| / 7 and code = clamp(rint(w / s), -8, 7) + 8, i.e. an
  implicit zero point of 8. With zero points (q4gGz) the range [lo, hi] of the group,
  widened to hold 0, gives s >= (hi - lo) / 15, zero = clamp(rint(-lo / s), 0, 15) and
  code = clamp(rint(w / s) + zero, 0, 15). `data` is uint32 (N, Kp / 8): code k of row n
  in bits 4 * (k % 8) of word [n, k // 8] (low nibble first: the little-endian bytes are
  ONNX Runtime's MatMulNBits blob). Zero points: uint32 (N, ceil(groups / 8)), the zero
  of group g in bits 4 * (g % 8) of word [n, g // 8], unused nibbles 0.
- Dequantized: W'[n, k] = (code - zero) * scale in float32, with the scale as stored
  (f16 widened exactly to f32): what `dequantize()` returns, and what a kernel computes.
- Rounding: rint (half to even). The stored scale is the exact one rounded UP to its
  type (f16 or f32), so no value is clamped and |W - W'| <= scale / 2 (as stored); and
  the codes are computed with the stored scale. A group (or row) of zeros gets scale 1,
  its codes dequantizing to exactly 0.
- Files (`save`): NAME.data.bin, NAME.scales.bin (NAME.zeros.bin), the raw little-endian
  arrays, and NAME.json, the manifest saying each one's dtype, shape and layout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from .arguments import NAME, ArgumentError, check_flag, check_folder, is_integer, shown
from .files import FileRefused, read_limited, write_whole

MANIFEST = "autotune-quantized-weight"  # the manifest's "manifest": what the file is
VERSION = 1  # the manifest's "version": a change to any layout below is a new version
GROUPS = (32, 64, 128)
SCALE_TYPES = {"f16": np.float16, "f32": np.float32}
MAX_MANIFEST_BYTES = 1 << 16
_FLOATS = (np.float16, np.float32, np.float64)


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A quantized N x K weight: packed codes, scales and (4-bit only) zero points, as
    the module doc lays them out; checked whole on construction (read-only copies)."""

    data: np.ndarray  # uint32: (N, Kp / 4) for q8, (N, Kp / 8) for 4-bit
    scales: np.ndarray  # float16 or float32: (N,) for q8, (N, Kp / group) for 4-bit
    zero_points: np.ndarray | None  # uint32 (N, ceil(groups / 8)), or None
    bits: int  # 8 or 4
    group: int | None  # None for q8; 32, 64 or 128 for 4-bit
    shape: tuple[int, int]  # (N, K): the original weight's

    def __post_init__(self) -> None:
        bits, group = _check_format(self.bits, self.group, self.zero_points is not None)
        if not (
            isinstance(self.shape, tuple | list)
            and len(self.shape) == 2
            and all(is_integer(n) and 1 <= n < 2**31 for n in self.shape)
        ):
            raise ArgumentError(
                "shape", f"shape must be (N, K) of integers >= 1, got {shown(self.shape)}"
            )
        set_ = object.__setattr__  # frozen: fields are set once, here
        set_(self, "bits", bits)
        set_(self, "group", group)
        set_(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        for field, dtypes in (("data", (np.uint32,)), ("scales", (np.float16, np.float32))):
            set_(self, field, _frozen_array(field, getattr(self, field), dtypes, self.files[field]))
        if self.zero_points is not None:
            zeros = _frozen_array(
                "zero_points", self.zero_points, (np.uint32,), self.files["zero_points"]
            )
            set_(self, "zero_points", zeros)
        _check_values(self)

    @property
    def padded_k(self) -> int:
        """Kp: K rounded up to a multiple of 4 (q8) or of the group (4-bit)."""
        step = 4 if self.bits == 8 else self.group
        return -(-self.shape[1] // step) * step

    @property
    def groups(self) -> int:
        """Scales per row: 1 for q8, Kp / group for 4-bit."""
        return 1 if self.bits == 8 else self.padded_k // self.group

    @property
    def format(self) -> str:
        """The short name: q8, q4g32, q4g64, q4g128, with z for zero points (q4g128z)."""
        return format_name(self.bits, self.group, self.zero_points is not None)

    @property
    def files(self) -> dict[str, dict]:
        """Each array's file: dtype, shape and layout in one line (the manifest's)."""
        n, kp = self.shape[0], self.padded_k
        zero_points = self.zero_points is not None
        layouts = file_layouts(self.bits, self.group, zero_points)
        scales = (n,) if self.bits == 8 else (n, self.groups)
        files = {
            "data": dict(dtype="uint32", shape=(n, kp * self.bits // 32), layout=layouts["data"]),
            "scales": dict(dtype=_scale_type(self.scales), shape=scales, layout=layouts["scales"]),
        }
        if zero_points:
            files["zero_points"] = dict(
                dtype="uint32", shape=(n, -(-self.groups // 8)), layout=layouts["zero_points"]
            )
        return files

    def codes(self) -> np.ndarray:
        """The integer codes, N x Kp (int32): q (-127..127) for q8, 0..15 for 4-bit."""
        words = self.data.astype("<u4")
        if self.bits == 8:
            return words.view(np.int8).reshape(self.shape[0], self.padded_k).astype(np.int32)
        nibbles = (words[:, :, None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 0xF
        return nibbles.reshape(self.shape[0], self.padded_k).astype(np.int32)

    def zeros(self) -> np.ndarray:
        """The zero point of each group, N x groups (int32): 0 for q8, 8 for 4-bit
        without zero points."""
        n = self.shape[0]
        if self.zero_points is None:
            return np.full((n, self.groups), 0 if self.bits == 8 else 8, np.int32)
        nibbles = (self.zero_points[:, :, None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 0xF
        return nibbles.reshape(n, -1)[:, : self.groups].astype(np.int32)

    def dequantize(self) -> np.ndarray:
        """W' = (code - zero) * scale in float32, N x K: exactly what a kernel computes
        from the stored bytes (one f32 product per element)."""
        width = self.padded_k // self.groups
        offset = np.repeat(self.zeros(), width, axis=1)
        scale = np.repeat(self.scales.reshape(self.shape[0], -1).astype(np.float32), width, axis=1)
        values = (self.codes() - offset).astype(np.float32) * scale
        return values[:, : self.shape[1]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuantizedWeight):
            return NotImplemented
        same = (self.bits, self.group, self.shape) == (other.bits, other.group, other.shape)
        arrays = [(self.data, other.data), (self.scales, other.scales)]
        arrays.append((self.zero_points, other.zero_points))
        return same and all(
            (a is None and b is None)
            or (a is not None and b is not None and a.dtype == b.dtype and np.array_equal(a, b))
            for a, b in arrays
        )

    __hash__ = None  # type: ignore[assignment]  # arrays: equal by value, not hashable

    @property
    def nbytes(self) -> int:
        """Bytes of the files' arrays together."""
        return sum(a.nbytes for a in (self.data, self.scales, self.zero_points) if a is not None)

    def manifest(self, name: str) -> dict:
        """NAME.json: what the files are and how to read them (docs/QUANTIZED.md)."""
        files = {
            role: dict(name=file_name(name, role), byte_order="little", **info)
            for role, info in self.files.items()
        }
        for info in files.values():
            info["shape"] = list(info["shape"])
        return {
            "manifest": MANIFEST,
            "version": VERSION,
            "format": self.format,
            "bits": self.bits,
            "group": self.group,
            "zero_points": self.zero_points is not None,
            "shape": list(self.shape),
            "padded_k": self.padded_k,
            "dequantize": "W[n, k] = (code - zero) * scale, in f32, for k < K",
            "files": files,
        }

    def save(self, folder: str | os.PathLike, name: str) -> dict[str, Path]:
        """Write NAME.data.bin, NAME.scales.bin (NAME.zeros.bin) and NAME.json into
        `folder` (made if missing), each whole; return the paths, the manifest's last."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ArgumentError(
                "name", f"name {shown(name)} must be a letter then letters, digits, '_' or '-'"
            )
        folder = check_folder("folder", folder, writable=True)
        if folder is None:
            raise ArgumentError("folder", "folder must be a folder path, got None")
        manifest = self.manifest(name)
        arrays = {"data": self.data, "scales": self.scales, "zero_points": self.zero_points}
        paths = {}
        try:
            for role, info in manifest["files"].items():
                paths[role] = folder / info["name"]
                write_whole(paths[role], _little(arrays[role]).tobytes())
            paths["manifest"] = folder / f"{name}.json"
            write_whole(paths["manifest"], json.dumps(manifest, indent=1) + "\n")
        except OSError as error:
            raise ArgumentError(
                "folder", f"folder {str(folder)!r} cannot be written: {error}"
            ) from None
        return paths

    @classmethod
    def load(cls, path: str | os.PathLike) -> QuantizedWeight:
        """Read a weight that `save` wrote, from its NAME.json; every file is checked
        against the manifest (sizes, dtypes, shapes) and refused (ArgumentError, field
        "path") otherwise."""
        return _load(Path(path))


_SUFFIX = {"data": "data", "scales": "scales", "zero_points": "zeros"}


def file_name(name: str, role: str) -> str:
    """The file `save` writes for one array: NAME.data.bin, NAME.scales.bin, NAME.zeros.bin
    (role: "data", "scales" or "zero_points")."""
    return f"{name}.{_SUFFIX[role]}.bin"


def file_layouts(bits: int, group: int | None, zero_points: bool) -> dict[str, str]:
    """Each array's layout in one line, by file role (data, scales, zero_points): the
    weight files' manifest and the export manifest's quantized buffers say the same."""
    if bits == 8:
        layouts = {
            "data": "int8 two's complement, 4 per word along K: element k of row n in bits "
            "8*(k%4) of word [n, k//4] (dot4I8Packed); k >= K holds 0",
            "scales": "one per row: W[n, k] = q * scales[n]",
        }
    else:
        zero = "its zero point" if zero_points else "8"
        layouts = {
            "data": "unsigned 4-bit codes, 8 per word along K: code k of row n in bits "
            "4*(k%8) of word [n, k//8]; k >= K holds the code of 0",
            "scales": f"one per {group} K of a row: W[n, k] = (code - {zero}) * "
            f"scales[n, k//{group}]",
        }
    if zero_points:
        layouts["zero_points"] = (
            "unsigned 4-bit zero points, 8 per word along the groups: group g of row n in "
            "bits 4*(g%8) of word [n, g//8]; unused nibbles 0"
        )
    return layouts


def _scale_type(scales: object) -> str:
    return "float16" if getattr(scales, "dtype", None) == np.float16 else "float32"


def _little(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder("<"))


def _frozen_array(field: str, value: object, dtypes: tuple, info: dict) -> np.ndarray:
    """A read-only copy of `value`, which must be an array of one of `dtypes` and the
    shape the format gives it."""
    if not isinstance(value, np.ndarray) or value.dtype.type not in dtypes:
        allowed = " or ".join(np.dtype(t).name for t in dtypes)
        kind = f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
        raise ArgumentError(field, f"{field} must be a NumPy {allowed} array, got {kind}")
    if value.shape != tuple(info["shape"]):
        raise ArgumentError(
            field, f"{field} has shape {value.shape}; the format needs {tuple(info['shape'])}"
        )
    copy = np.array(value, dtype=value.dtype.newbyteorder("="), copy=True)
    copy.setflags(write=False)
    return copy


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of `x` (..., K) as int8 codes and a power-of-two float32 scale: exactly
    what a kernel with activations "q8" computes before its product (a first pass, or
    each workgroup of a one-pass decode kernel).

    amax = max |x| of the row = f * 2**e with f in [0.5, 1); scale = 2**(e - 7);
    code = clamp(rint(x * 2**(7 - e)), -127, 127). A power of two makes x / scale exact
    (no division, whose rounding WGSL leaves to the device), so the codes are the same
    bits everywhere; |x - code * scale| <= scale / 2 except where amax / scale rounds
    past 127 (amax above 127.5 * scale), clamped by at most one code. A row of zeros has
    codes 0. Returns (codes int8 of x's shape, scales float32 of x's shape minus K).
    """
    x = np.asarray(x).astype(np.float32)
    _, e = np.frexp(np.max(np.abs(x), axis=-1, keepdims=True))
    codes = np.clip(np.rint(np.ldexp(x, 7 - e)), -127, 127).astype(np.int8)
    return codes, np.ldexp(np.float32(1), e - 7).astype(np.float32)[..., 0]


_FORMAT = re.compile(r"q8|q4g(32|64|128)(z?)", re.ASCII)


def parse_format(text: object) -> tuple[int, int | None, bool]:
    """(bits, group, zero points) of a format name ("q8", "q4g128", "q4g32z"), or
    ArgumentError naming `weights`."""
    match = _FORMAT.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise ArgumentError(
            "weights",
            f"weights {shown(text, 40)} is not a format; formats: none, q8, q4gG and q4gGz "
            "with G one of 32, 64, 128 (z: zero points)",
        )
    if text == "q8":
        return 8, None, False
    return 4, int(match[1]), match[2] == "z"


def format_name(bits: int, group: int | None, zero_points: bool) -> str:
    """The short name of a format: q8, q4g32, q4g64, q4g128, with z for zero points."""
    return "q8" if bits == 8 else f"q4g{group}" + ("z" if zero_points else "")


def _check_format(bits: object, group: object, zero_points: bool) -> tuple[int, int | None]:
    """bits, group and zero points that make a format, or ArgumentError naming the one."""
    if not is_integer(bits) or bits not in (4, 8):
        raise ArgumentError("bits", f"bits must be 4 or 8, got {shown(bits)}")
    if bits == 8:
        if group is not None:
            raise ArgumentError(
                "group", f"group must be None for bits=8 (one scale per row), got {shown(group)}"
            )
        if zero_points:
            raise ArgumentError("zero_points", "zero_points are for bits=4 only; q8 is symmetric")
        return 8, None
    if group is None:
        raise ArgumentError("group", "group is required for bits=4: one of 32, 64, 128")
    if not is_integer(group) or group not in GROUPS:
        raise ArgumentError("group", f"group must be one of 32, 64, 128, got {shown(group)}")
    return 4, int(group)


def _check_values(qw: QuantizedWeight) -> None:
    """What the quantizer never writes: a scale not finite and > 0, a q8 byte of -128,
    padding that does not dequantize to 0, a zero point nibble past the last group."""
    scales = qw.scales.astype(np.float64)
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        bad = scales[~(np.isfinite(scales) & (scales > 0))][0]
        raise ArgumentError("scales", f"scales must be finite and > 0, got {bad}")
    codes = qw.codes()
    if qw.bits == 8 and (codes == -128).any():
        n, k = np.argwhere(codes == -128)[0]
        raise ArgumentError("data", f"data holds -128 at row {n}, k {k}; q8 codes are -127..127")
    zeros = qw.zeros()
    padding = codes[:, qw.shape[1] :] != zeros[:, -1:]
    if padding.any():
        n, k = np.argwhere(padding)[0]
        raise ArgumentError(
            "data", f"data's padding at row {n}, k {qw.shape[1] + k} is not the code of 0"
        )
    if qw.zero_points is not None:
        spare = (qw.zero_points[:, -1] >> np.uint32(4 * (qw.groups % 8))) if qw.groups % 8 else 0
        if np.any(spare):
            raise ArgumentError(
                "zero_points", "zero_points has a nonzero nibble past the last group"
            )


def quantize(
    W: np.ndarray,
    bits: int = 8,
    group: int | None = None,
    zero_points: bool = False,
    scales: str = "f16",
) -> QuantizedWeight:
    """Quantize the weight W (N x K, y = x @ W.T; float16/32/64, finite) to `bits` 8 (one
    scale per row) or 4 (one per `group` of 32, 64 or 128 K; with `zero_points`,
    asymmetric), with f16 or f32 scales. The layout is the module doc's."""
    zero_points = check_flag("zero_points", zero_points)
    bits, group = _check_format(bits, group, zero_points)
    if not isinstance(scales, str) or scales not in SCALE_TYPES:
        raise ArgumentError("scales", f"scales must be 'f16' or 'f32', got {shown(scales)}")
    W = _check_weight(W)
    n, k = W.shape
    step = 4 if bits == 8 else group
    padded = np.zeros((n, -(-k // step) * step))
    padded[:, :k] = W
    width = padded.shape[1] if bits == 8 else group
    blocks = padded.reshape(n, -1, width)  # (N, groups, values per scale)
    if bits == 8 or not zero_points:
        top = 127 if bits == 8 else 7
        scale = _stored_scale(np.abs(blocks).max(axis=2) / top, scales, blocks)
        low, high = (-127, 127) if bits == 8 else (-8, 7)
        q = np.clip(np.rint(blocks / scale.astype(np.float64)[:, :, None]), low, high)
        zero = np.zeros(scale.shape) if bits == 8 else np.full(scale.shape, 8.0)
        codes = (q + zero[:, :, None]).reshape(n, -1)
    else:
        lo = np.minimum(blocks.min(axis=2), 0)  # the range holds 0: 0 is exact
        hi = np.maximum(blocks.max(axis=2), 0)
        scale = _stored_scale((hi - lo) / 15, scales, blocks)
        wide = scale.astype(np.float64)
        zero = np.clip(np.rint(-lo / wide), 0, 15)
        codes = np.clip(np.rint(blocks / wide[:, :, None]) + zero[:, :, None], 0, 15)
        codes = codes.reshape(n, -1)
    data = _pack(codes.astype(np.int64), bits)
    zeros = _pack(_pad_to(zero.astype(np.int64), 8), 4) if zero_points else None
    return QuantizedWeight(
        data, scale.reshape(n) if bits == 8 else scale, zeros, bits, group, (n, k)
    )


def _pad_to(values: np.ndarray, multiple: int) -> np.ndarray:
    extra = -values.shape[1] % multiple
    return np.pad(values, ((0, 0), (0, extra)))


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (N x Kp) into uint32 words along a row, the lowest bits first: 4 bytes in
    two's complement (8 bits) or 8 unsigned nibbles (4 bits)."""
    per = 32 // bits
    fields = (codes & ((1 << bits) - 1)).astype(np.uint64).reshape(codes.shape[0], -1, per)
    shifts = np.arange(0, 32, bits, dtype=np.uint64)
    return (fields << shifts).sum(axis=2).astype(np.uint32)  # no two fields overlap


def _check_weight(W: object) -> np.ndarray:
    """W as float64, or ArgumentError naming it: a 2-D, non-empty float array, finite."""
    if not isinstance(W, np.ndarray):
        raise ArgumentError("W", f"W must be a 2-D NumPy float array, got {type(W).__name__}")
    if W.dtype.type not in _FLOATS:
        raise ArgumentError("W", f"W must be float16, float32 or float64, got {W.dtype}")
    if W.ndim != 2 or W.size == 0:
        raise ArgumentError("W", f"W must be a non-empty 2-D array (N x K), got shape {W.shape}")
    if W.shape[0] >= 2**31 or W.shape[1] >= 2**31:
        raise ArgumentError("W", f"W's N and K must be < 2**31, got shape {W.shape}")
    finite = np.isfinite(W)
    if not finite.all():
        n, k = np.argwhere(~finite)[0]
        raise ArgumentError("W", f"W must be finite, got {W[n, k]} at [{n}, {k}]")
    return W.astype(np.float64)


def _stored_scale(exact: np.ndarray, scales: str, blocks: np.ndarray) -> np.ndarray:
    """The exact scales rounded UP to their type (so no value is clamped); 1 for a block
    of zeros (its codes dequantize to exactly 0). Refused where the type cannot hold it."""
    kind = SCALE_TYPES[scales]
    with np.errstate(over="ignore"):
        stored = exact.astype(kind)
    below = stored.astype(np.float64) < exact
    stored[below] = np.nextafter(stored[below], kind(np.inf))
    stored[exact == 0] = 1
    if not np.isfinite(stored).all():
        n, g = np.argwhere(~np.isfinite(stored))[0]
        biggest = np.abs(blocks[n, g]).max()
        advice = (
            "; scales='f32' holds it, for other projects (autotune's kernels read f16 "
            "scales: divide W by a factor before quantizing, and multiply the output by it)"
            if scales == "f16"
            else ""
        )
        raise ArgumentError(
            "scales",
            f"scales {scales!r} cannot hold the scale {exact[n, g]:.6g} of row {n}, group "
            f"{g} (max |W| {biggest:.6g}){advice}",
        )
    return stored


def _load(path: Path) -> QuantizedWeight:
    """QuantizedWeight.load: the manifest, then each file checked against it."""

    def refuse(reason: str) -> ArgumentError:
        return ArgumentError("path", f"path {str(path)!r}: {reason}")

    try:
        manifest = json.loads(read_limited(path, MAX_MANIFEST_BYTES).decode())
    except (OSError, FileRefused, UnicodeDecodeError, ValueError) as error:
        raise refuse(f"cannot be read as a manifest: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("manifest") != MANIFEST:
        raise refuse(f"not a manifest of {MANIFEST!r}")
    if manifest.get("version") != VERSION:
        raise refuse(f"version {shown(manifest.get('version'))} is not {VERSION}")
    files = manifest.get("files")
    shape = manifest.get("shape")
    if not isinstance(files, dict) or not isinstance(shape, list):
        raise refuse("no 'files' object or 'shape' list")
    arrays = {}
    for role in ("data", "scales", "zero_points"):
        info = files.get(role)
        arrays[role] = None if info is None else _read_array(path, info, refuse)
    try:
        qw = QuantizedWeight(
            arrays["data"], arrays["scales"], arrays["zero_points"],
            manifest.get("bits"), manifest.get("group"), tuple(shape),
        )  # fmt: skip
    except ArgumentError as error:
        raise refuse(f"{error.field}: {error}") from None
    wrong = _mismatch(qw.manifest("NAME"), manifest)
    if wrong:
        raise refuse(f"{wrong} does not match the arrays' format")
    return qw


_CHECKED = ("manifest", "version", "format", "bits", "group", "zero_points", "shape", "padded_k")


def _mismatch(expected: dict, manifest: dict) -> str | None:
    """The first field of `manifest` that says other than the arrays it names (layout
    texts and file names are free); None if all agree."""
    for key in _CHECKED:
        if manifest.get(key) != expected[key]:
            return f"{key} {shown(manifest.get(key))}"
    if set(manifest["files"]) != set(expected["files"]):
        return f"files {sorted(manifest['files'])}"
    for role, info in expected["files"].items():
        for key in ("dtype", "shape", "byte_order"):
            if manifest["files"][role].get(key) != info[key]:
                return f"files.{role}.{key} {shown(manifest['files'][role].get(key))}"
    return None


def _read_array(path: Path, info: object, refuse) -> np.ndarray:
    """One .bin named in the manifest, beside it: exactly dtype x shape bytes."""
    if not isinstance(info, dict):
        raise refuse(f"a file entry must be an object, got {shown(info)}")
    name, dtype, shape = info.get("name"), info.get("dtype"), info.get("shape")
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise refuse(f"file name {shown(name)} must be a plain name beside the manifest")
    if dtype not in ("uint32", "float16", "float32"):
        raise refuse(f"{name}: dtype {shown(dtype)} is not uint32, float16 or float32")
    if not (
        isinstance(shape, list) and shape and all(is_integer(d) and 0 < d < 2**31 for d in shape)
    ):
        raise refuse(f"{name}: shape {shown(shape)} is not a list of sizes")
    size = math.prod(shape) * np.dtype(dtype).itemsize
    try:
        raw = read_limited(path.parent / name, size)
    except (OSError, FileRefused) as error:
        says = f"its manifest says {shape} {dtype}: {size} bytes"
        raise refuse(f"{name} cannot be read: {error}; {says}") from None
    if len(raw) != size:
        raise refuse(f"{name} has {len(raw)} bytes; its manifest says {shape} {dtype}: {size}")
    return np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).reshape(shape).astype(dtype)
