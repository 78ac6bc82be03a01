"""A three-layer MLP kept on the GPU end to end, y = gelu(gelu(x W1ᵀ + b1) W2ᵀ + b2) W3ᵀ + b3:
each GEMM a kernel from `autotune.lookup` on the caller's own wgpu device, all three
recorded with `kernel.encode` into one command encoder, with no host round trip between
layers. The result is checked against NumPy (float64), then a forward pass is timed, in
alternating rounds, three ways:

- chained: the three kernels recorded into one encoder, submitted, waited for (x and the
  weights stay on the GPU, as in an inference engine);
- round trips: the same MLP through `autotune.matmul` (each GEMM uploads its operands,
  dispatches and reads C back);
- torch, where PyTorch has CUDA: the same layers in f32 (TF32 off), synchronized.

    python benchmarks/mlp.py --tokens 16 --widths 4096,11008,4096,4096 --out DIR
    python benchmarks/mlp.py --quick --out DIR     # tiny sizes: a dry run on any adapter

Writes DIR/mlp.json and DIR/mlp.md; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent))  # this checkout's autotune

from timing import provenance  # noqa: E402

import autotune  # noqa: E402
from autotune.device import compute_limits, gpu_of  # noqa: E402

EPILOGUES = ("bias,gelu", "bias,gelu", "bias")  # the three layers'


def gelu(x: np.ndarray) -> np.ndarray:
    """The tanh approximation, as the kernels' epilogue and torch's approximate="tanh"."""
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def layers(tokens: int, widths: list[int], seed: int = 0):
    """x, and per layer (W stored out x in, b), scaled so activations stay near 1."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, widths[0])).astype(np.float32)
    weights = []
    for k, n in zip(widths, widths[1:], strict=False):
        W = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        weights.append((W, rng.standard_normal(n).astype(np.float32)))
    return x, weights


def reference(x: np.ndarray, weights) -> np.ndarray:
    y = x.astype(np.float64)
    for (W, b), epilogue in zip(weights, EPILOGUES, strict=True):
        y = y @ W.T.astype(np.float64) + b
        y = gelu(y) if "gelu" in epilogue else y
    return y


class Chained:
    """The MLP on a device of our own (as a wgpu user's), its buffers resident."""

    def __init__(self, x, weights, checks: bool):
        import wgpu

        adapter = autotune.get_gpu().adapter
        self.device = adapter.request_device_sync(
            required_features=sorted(autotune.get_gpu().features),
            required_limits=compute_limits(adapter),
        )
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        self.usage, self.gpu = usage, gpu_of(self.device)
        self.x = self._upload(x)
        self.steps = []  # (kernel, A buffer, W buffer, C buffer, bias buffer)
        a = self.x
        for (W, b), epilogue in zip(weights, EPILOGUES, strict=True):
            n, k = W.shape
            kernel = autotune.lookup(
                x.shape[0], n, k, layout="nt", epilogue=epilogue, checks=checks, device=self.device
            )
            c = self.device.create_buffer(size=kernel.buffer_sizes()["C"], usage=usage)
            self.steps.append((kernel, a, self._upload(W), c, self._upload(b)))
            a = c

    def _upload(self, array: np.ndarray):
        return self.device.create_buffer_with_data(data=array, usage=self.usage)

    def forward(self) -> None:
        encoder = self.device.create_command_encoder()
        for kernel, a, w, c, b in self.steps:
            kernel.encode(encoder, a, w, c, bias=b)
        self.device.queue.submit([encoder.finish()])
        self.gpu.wait_idle()

    def result(self, shape) -> np.ndarray:
        data = np.frombuffer(self.device.queue.read_buffer(self.steps[-1][3]), np.float32)
        return data[: np.prod(shape)].reshape(shape)

    def sources(self) -> list[str]:
        return [f"{k.source} {k.config.template}" for k, *_ in self.steps]


def round_trips(x, weights, checks: bool) -> np.ndarray:
    """The MLP through autotune.matmul: every GEMM uploads, dispatches and reads back."""
    y = x
    for (W, b), epilogue in zip(weights, EPILOGUES, strict=True):
        activation = "gelu" if "gelu" in epilogue else None
        y = autotune.matmul(y, W, bias=b, activation=activation, trans_b=True, checks=checks)
    return y


def torch_forward(x, weights):
    """A function running the MLP in torch on CUDA (synchronized), or None without it."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    tx = torch.from_numpy(x).cuda()
    tw = [(torch.from_numpy(W).cuda(), torch.from_numpy(b).cuda()) for W, b in weights]
    functional = torch.nn.functional

    def forward():
        y = tx
        for (W, b), epilogue in zip(tw, EPILOGUES, strict=True):
            y = functional.linear(y, W, b)
            y = functional.gelu(y, approximate="tanh") if "gelu" in epilogue else y
        torch.cuda.synchronize()

    return forward


def timed(run, rounds: int, per_round: int) -> list[float]:
    """Seconds per call of `run`: the median of each round of `per_round` calls."""
    medians = []
    for _ in range(rounds):
        seconds = []
        for _ in range(per_round):
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
        medians.append(statistics.median(seconds))
    return medians


def table(report: dict) -> str:
    t = report["seconds"]
    lines = [
        f"MLP {report['tokens']} tokens, widths {report['widths']}, f32 nt, checks "
        f"{'on' if report['checks'] else 'off'}; {report['provenance']['device']}",
        "| forward pass | ms | its time / chained's |",
        "|---|---|---|",
    ]
    for name, seconds in t.items():
        lines.append(
            f"| {name.replace('_', ' ')} | {seconds * 1e3:.3f} | {seconds / t['chained']:.2f} |"
        )
    return "\n".join(lines)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def alternating(runs: dict, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Each way's median seconds per call in each round; every round times every way."""
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            run()  # warm
            samples[name] += timed(run, 1, per_round)
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--widths", default="4096,11008,4096,4096", help="in,h1,h2,out")
    parser.add_argument("--checks", choices=("on", "off"), default="off")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one short round")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    if args.quick:
        args.tokens, widths, args.rounds = 4, [32, 48, 40, 24], 1
    if len(widths) != 4 or min(widths + [args.tokens]) < 1:
        parser.error("--widths takes four sizes >= 1 (in, two hidden, out); --tokens >= 1")
    checks = args.checks == "on"
    x, weights = layers(args.tokens, widths)
    want = reference(x, weights)
    chained = Chained(x, weights, checks)
    chained.forward()
    errors = {
        "chained": relative_error(chained.result(want.shape), want),
        "round_trips": relative_error(round_trips(x, weights, checks), want),
    }
    for name, error in errors.items():
        if not error < 1e-3:
            raise SystemExit(f"{name}: relative error {error:.3g} against float64")
    runs = {"chained": chained.forward, "round_trips": lambda: round_trips(x, weights, checks)}
    if (forward := torch_forward(x, weights)) is not None:
        runs["torch"] = forward
    samples = alternating(runs, args.rounds, 3 if args.quick else 20)
    report = {
        "provenance": provenance(autotune.get_gpu()),
        "tokens": args.tokens,
        "widths": widths,
        "checks": checks,
        "sources": chained.sources(),
        "errors": errors,
        "rounds_s": samples,
        "seconds": {name: statistics.median(s) for name, s in samples.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mlp.json").write_text(json.dumps(report, indent=1))
    (args.out / "mlp.md").write_text(table(report) + "\n")
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
