"""Probe what bounds the one-row 4-bit decode: qgemv with A's loads or B's loads replaced
by synthetic values (timing only, unverified), f16 activations, qdotv with either pass
emptied, a plain streaming read of the same bytes, and the f16 gemv at 16 rows with A or
B replaced. From the checkout: PYTHONPATH=. python PATH/probe.py (--quick: tiny shapes)."""

import re
import sys
from dataclasses import replace

import numpy as np
import wgpu

sys.path.insert(0, "benchmarks")
import autotune
from autotune.compile import create_pipeline
from autotune.measure import measure
from autotune.problem import parse_shape
from autotune.render import render
from autotune.space import Config
from autotune.verify import random_operands

gpu = autotune.get_gpu()
QUICK = "--quick" in sys.argv


def patched(wgsl: str, what: str) -> str:
    if "noA" in what:
        wgsl = wgsl.replace("return vec4<f32>(A[e]);", "return vec4<f32>(f32(e & 7u));")
    if "noB" in what:
        wgsl = re.sub(r"(?<![A-Za-z_0-9])B\[", "bsyn(", wgsl)
        wgsl = re.sub(r"bsyn\(([^\]]+)\]", r"bsyn(\1)", wgsl)
        wgsl += "\nfn bsyn(i: u32) -> u32 { return i * 2654435761u; }\n"
    if "Abcast" in what:
        wgsl = re.sub(r"A\[abase \+ (\d+)u \+ [^\]]+\]", r"A[abase + \1u]", wgsl)
    if "gemvAconst" in what:
        wgsl = re.sub(r"vec4<f32>\(A\[abase[^\]]*\]\)", "vec4<f32>(f32(t & 7u))", wgsl)
    if "gemvBconst" in what:
        wgsl = re.sub(r"vec4<f32>\(B\[[^\]]*\]\)", "vec4<f32>(f32(t & 3u))", wgsl)
    for entry in ("quantize", "gemv"):
        if f"no{entry}" in what:
            wgsl = re.sub(r"(fn " + entry + r"\([^{]*\{)", r"\1\n  if (K > 0u) { return; }", wgsl)
    return wgsl


def time_config(shape, params, what="", template="qgemv", **variant):
    problem = parse_shape(shape, layout="nt", **({"weights": "q4g128"} | variant))
    shader = render(Config.make(template, params), problem)
    shader = replace(shader, wgsl=patched(shader.wgsl, what))
    compiled = create_pipeline(shader, gpu, checks=False)
    ops = random_operands(problem, np.random.default_rng(0))
    m = measure(compiled, gpu, operands=ops, min_pass_s=0.002 if QUICK else 0.02)
    return m.median_s


STREAM = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
  let n = arrayLength(&src);
  let stride = nw.x * 256u;
  var s = vec4<u32>(0u);
  for (var i = gid.x; i < n; i += stride * L) {
    %LOADS%
  }
  if (s.x == 12345u) { dst[gid.x] = s.y; }
}
"""


def stream_seconds(nbytes, loads, groups, repeats=50):
    body = "\n    ".join(
        f"if (i + {j}u * stride < n) {{ s ^= src[i + {j}u * stride]; }}" for j in range(loads)
    )
    src = STREAM.replace("%LOADS%", body).replace("stride * L", f"stride * {loads}u")
    module = gpu.create_shader_module(src, checks=False, label="stream")
    pipe = gpu.device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    a = gpu.device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.STORAGE)
    d = gpu.device.create_buffer(size=groups * 256 * 4, usage=wgpu.BufferUsage.STORAGE)
    bind = gpu.device.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[
            {"binding": 0, "resource": {"buffer": a}},
            {"binding": 1, "resource": {"buffer": d}},
        ],
    )
    qs = gpu.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    rb = gpu.device.create_buffer(
        size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
    )
    best = []
    for _ in range(7):
        enc = gpu.device.create_command_encoder()
        p = enc.begin_compute_pass(
            timestamp_writes={
                "query_set": qs,
                "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1,
            }
        )
        p.set_pipeline(pipe)
        p.set_bind_group(0, bind)
        for _ in range(repeats):
            p.dispatch_workgroups(groups)
        p.end()
        enc.resolve_query_set(qs, 0, 2, rb, 0)
        gpu.queue.submit([enc.finish()])
        t = np.frombuffer(gpu.queue.read_buffer(rb), dtype=np.uint64)
        best.append(float(t[1] - t[0]) * gpu.timestamp_period_ns * 1e-9 / repeats)
    return float(np.median(best[2:]))


def main():
    shapes = ["1x11008x4096", "1x4096x4096"] if not QUICK else ["1x256x512"]
    base = dict(AV=4, BW=1, DQ=1, NC=2, TK=64, U=4, WG=128)
    if QUICK:
        base = dict(AV=4, BW=1, DQ=1, NC=2, TK=16, U=1, WG=64)
    rows = []
    for shape in shapes:
        n, k = (int(x) for x in shape.split("x")[1:])
        wbytes = n * k // 2
        for nc in (1, 2, 4, 8):
            for what in ("", "noA", "noB", "noA noB"):
                params = base | {"NC": nc}
                try:
                    s = time_config(shape, params, what)
                except Exception as e:  # noqa: BLE001
                    print(shape, nc, what, "FAILED", str(e)[:200], flush=True)
                    continue
                rows.append((shape, f"NC={nc} {what or 'as is'}", s, wbytes / s / 1e12))
                print(*rows[-1], flush=True)
        for nc in (2, 4):
            try:
                s = time_config(shape, base | {"NC": nc}, "", dtype="f16")
                rows.append((shape, f"NC={nc} f16 activations", s, wbytes / s / 1e12))
                print(*rows[-1], flush=True)
            except Exception as e:  # noqa: BLE001
                print(shape, "f16", "FAILED", str(e)[:200], flush=True)
        qd = (
            dict(NC=4, QWG=256, TK=64, U=4, WG=128)
            if not QUICK
            else dict(NC=2, QWG=64, TK=16, U=1, WG=64)
        )
        for what in ("", "noquantize", "nogemv", "noquantize nogemv"):
            s = time_config(shape, qd, what, template="qdotv", activations="q8")
            rows.append((shape, f"qdotv {what or 'as is'}", s, wbytes / s / 1e12))
            print(*rows[-1], flush=True)
        for loads in (1, 4):
            for groups in (132 * 8, 132 * 16, 132 * 32, wbytes // (16 * 256 * loads)):
                if QUICK:
                    groups = max(1, groups // 256)
                s = stream_seconds(wbytes, loads, groups)
                rows.append((shape, f"stream {loads} loads {groups} wgs", s, wbytes / s / 1e12))
                print(*rows[-1], flush=True)
    served = dict(ACC=0, NC=4, SG=0, TK=64, U=2, VEC=4, WG=64)
    for shape in ["16x11008x4096", "1x11008x4096"] if not QUICK else ["16x256x512"]:
        n, k = (int(x) for x in shape.split("x")[1:])
        for what in ("", "Abcast", "gemvAconst", "gemvBconst", "gemvAconst gemvBconst"):
            if QUICK:
                served = dict(ACC=0, NC=4, SG=0, TK=16, U=1, VEC=4, WG=64)
            s = time_config(shape, served, what, template="gemv", dtype="f16", weights="none")
            rows.append((shape, f"gemv f16 {what or 'as is'}", s, n * k * 2 / s / 1e12))
            print(*rows[-1], flush=True)
    print("\nshape | variant | us | TB/s of weight codes")
    for shape, what, s, tbs in rows:
        print(f"{shape} | {what} | {s * 1e6:.2f} | {tbs:.2f}")


main()
