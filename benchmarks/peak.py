"""Peak arithmetic rate of WGSL on this adapter: chains of fma, no memory traffic.

    python benchmarks/peak.py [GROUPS]    # GROUPS workgroups of 256 (default 132 * 64)

For f32 and f16 (`enable f16;`), in scalars, vec2 and vec4, written as `fma()` and as
`a * b + c`, each invocation runs ITER steps of 8 independent chains, so the rate is bound
by the FMA units alone. If f16 comes out near twice f32 in some form, the driver packs f16
pairs into paired half-precision FMAs (HFMA2 on NVIDIA), and a GEMM written that way can
hope for up to twice the f32 rate; near 1x in every form, no WGSL f16 GEMM can (the H200,
2026-11-30: 1.02x in all six, results/2026-11-30-h200-ceilings/peak.txt).
Runtime checks are off; the time is the wall clock over 20 dispatches after a warm-up.
"""

from __future__ import annotations

import sys
import time

import wgpu

import autotune

ITER = 4096
CHAINS = 8
WORKGROUP = 256
WIDTHS = (1, 2, 4)
# `fma()` becomes SPIR-V's exact Fma instruction; `a * m + k` a multiply and an add that
# the driver may contract into its own FMA (and perhaps pack where it would not pack Fma).
FORMS = ("fma", "mul-add")


def shader(dtype: str, width: int, form: str) -> str:
    vt = dtype if width == 1 else f"vec{width}<{dtype}>"
    chains = "\n".join(
        f"  var a{c} = {vt}({dtype}(f32(gid.x + {c}u) * 1e-6));" for c in range(CHAINS)
    )
    step = "fma(a{c}, m, k)" if form == "fma" else "a{c} * m + k"
    steps = "\n".join(f"    a{c} = {step.format(c=c)};" for c in range(CHAINS))
    total = " + ".join(f"a{c}" for c in range(CHAINS))
    return f"""{"enable f16;" if dtype == "f16" else ""}
@group(0) @binding(0) var<storage, read_write> out: array<{vt}>;
@compute @workgroup_size({WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
{chains}
  let m = {vt}({dtype}(0.999));
  let k = {vt}({dtype}(0.001));
  for (var i = 0u; i < {ITER}u; i++) {{
{steps}
  }}
  out[gid.x] = {total};
}}
"""


def rate(gpu, dtype: str, width: int, groups: int, form: str) -> float:
    device = gpu.device
    module = gpu.create_shader_module(
        shader(dtype, width, form), checks=False, label=f"peak {dtype} x{width} {form}"
    )
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    out = device.create_buffer(size=groups * WORKGROUP * 16, usage=wgpu.BufferUsage.STORAGE)
    bind = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0),
        entries=[{"binding": 0, "resource": {"buffer": out}}],
    )

    def run(times: int) -> float:
        encoder = device.create_command_encoder()
        for _ in range(times):
            p = encoder.begin_compute_pass()
            p.set_pipeline(pipeline)
            p.set_bind_group(0, bind)
            p.dispatch_workgroups(groups)
            p.end()
        start = time.perf_counter()
        device.queue.submit([encoder.finish()])
        gpu.wait_idle()
        return time.perf_counter() - start

    for _ in range(3):  # warm-up: clocks ramp up under load
        run(20)
    seconds = min(run(20) for _ in range(3)) / 20
    flops = groups * WORKGROUP * ITER * CHAINS * width * 2
    return flops / seconds / 1e12


def main() -> int:
    gpu = autotune.get_gpu()
    groups = int(sys.argv[1]) if len(sys.argv) > 1 else 132 * 64
    print(gpu.summary)
    for form in FORMS:
        for width in WIDTHS:
            f32, f16 = (rate(gpu, dtype, width, groups, form) for dtype in ("f32", "f16"))
            name = "scalar" if width == 1 else f"vec{width}"
            print(f"{name} {form}: f32 {f32:.1f} TFLOP/s, f16 {f16:.1f}, f16 / f32 {f16 / f32:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
