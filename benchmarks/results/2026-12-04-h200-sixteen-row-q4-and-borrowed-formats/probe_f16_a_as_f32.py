"""Probe: the f16 decode at 16 rows with A bound as f32 (as if converted once by a first
pass) against A as f16, at several gemv configs; and a conversion pass's own time.
From the checkout: PYTHONPATH=. python PATH/probe_f16_a_as_f32.py
(--quick: tiny shapes). Timing only; the max relative error printed is a sanity check."""

import sys
from dataclasses import replace

import numpy as np
import wgpu

import autotune
from autotune.compile import create_pipeline
from autotune.kernel import Bound, input_arrays
from autotune.measure import measure
from autotune.problem import parse_shape
from autotune.render import render
from autotune.space import Config
from autotune.verify import random_operands

gpu = autotune.get_gpu()
QUICK = "--quick" in sys.argv


def time_config(shape, params, a32):
    problem = parse_shape(shape, layout="nt", dtype="f16")
    shader = render(Config.make("gemv", params), problem)
    wgsl = shader.wgsl
    A, B = random_operands(problem, np.random.default_rng(0))
    if a32:
        old = "var<storage, read> A: array<vec4<f16>>"
        assert old in wgsl
        wgsl = wgsl.replace(old, "var<storage, read> A: array<vec4<f32>>")
        wgsl = wgsl.replace("return A[i / VEC][i % VEC];", "return f16(A[i / VEC][i % VEC]);")
        A = A.astype(np.float32)
    shader = replace(shader, wgsl=wgsl)
    compiled = create_pipeline(shader, gpu, checks=False)
    bound = Bound.make(
        compiled,
        gpu,
        input_arrays(A, B) | {"C": np.zeros(problem.matrix_shapes()["C"], np.float16)},
    )
    bound.run()
    C = bound.read("C").astype(np.float64)
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    err = float(np.max(np.abs(C - ref)) / (np.max(np.abs(ref)) + 1e-30))
    m = measure(compiled, gpu, operands=(A, B), min_pass_s=0.002 if QUICK else 0.02)
    return m.median_s, err


CONVERT = """
enable f16;
@group(0) @binding(0) var<storage, read> src: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  if (gid.x < arrayLength(&src)) { dst[gid.x] = vec4<f32>(src[gid.x]); }
}
"""


def convert_seconds(elements, repeats=50):
    module = gpu.create_shader_module(CONVERT, checks=False, label="convert")
    pipe = gpu.device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    s = gpu.device.create_buffer(size=elements * 2, usage=wgpu.BufferUsage.STORAGE)
    d = gpu.device.create_buffer(size=elements * 4, usage=wgpu.BufferUsage.STORAGE)
    bind = gpu.device.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[
            {"binding": 0, "resource": {"buffer": s}},
            {"binding": 1, "resource": {"buffer": d}},
        ],
    )
    qs = gpu.device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
    rb = gpu.device.create_buffer(
        size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
    )
    got = []
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
            p.dispatch_workgroups((elements // 4 + 255) // 256)
        p.end()
        enc.resolve_query_set(qs, 0, 2, rb, 0)
        gpu.queue.submit([enc.finish()])
        t = np.frombuffer(gpu.queue.read_buffer(rb), dtype=np.uint64)
        got.append(float(t[1] - t[0]) * gpu.timestamp_period_ns * 1e-9 / repeats)
    return float(np.median(got[2:]))


def main():
    shapes = ["16x11008x4096", "16x4096x11008"] if not QUICK else ["16x256x512"]
    configs = [
        dict(NC=4, TK=64, U=2, WG=64),
        dict(NC=4, TK=64, U=1, WG=128),
        dict(NC=4, TK=32, U=2, WG=64),
        dict(NC=4, TK=32, U=1, WG=128),
        dict(NC=4, TK=16, U=2, WG=64),
        dict(NC=4, TK=64, U=1, WG=64),
        dict(NC=8, TK=16, U=1, WG=64),
        dict(NC=8, TK=32, U=1, WG=64),
        dict(NC=8, TK=64, U=1, WG=64),
        dict(NC=8, TK=16, U=1, WG=128),
        dict(NC=2, TK=64, U=4, WG=64),
        dict(NC=2, TK=32, U=4, WG=128),
    ]
    if QUICK:
        configs = [dict(NC=4, TK=16, U=1, WG=64), dict(NC=8, TK=16, U=1, WG=64)]
    rows = []
    for shape in shapes:
        for c in configs:
            params = dict(ACC=0, SG=0, VEC=4) | c
            for a32 in (False, True):
                try:
                    s, err = time_config(shape, params, a32)
                except Exception as e:  # noqa: BLE001
                    print(shape, c, a32, "FAILED", str(e)[:300], flush=True)
                    continue
                rows.append(
                    (
                        shape,
                        f"NC={c['NC']} TK={c['TK']} U={c['U']} WG={c['WG']}",
                        "f32" if a32 else "f16",
                        s,
                        err,
                    )
                )
                print(*rows[-1], flush=True)
        M, N, K = (int(x) for x in shape.split("x"))
        rows.append((shape, "convert pass", "-", convert_seconds(M * K), 0.0))
        print(*rows[-1], flush=True)
    print("\nshape | config | A as | us | max rel err")
    for shape, what, a, s, err in rows:
        print(f"{shape} | {what} | {a} | {s * 1e6:.2f} | {err:.1e}")


main()
