"""autotune: WGSL GEMM kernels generated from templates and tuned on the real GPU.

import numpy as np, autotune
C = autotune.matmul(A, B)                     # best known kernel for the shape
kernel = autotune.lookup(M, N, K)             # .wgsl, .config, .source, callable
result = autotune.tune(M, N, K, trials=30)    # search, verify, time, cache
results = autotune.tune_many(problems, timeout=20)  # a list, or a model's representatives
y = autotune.matmul(x, W, bias=b, activation="gelu", trans_b=True)  # f16 too, batched too
qw = autotune.quantize(W, bits=4, group=128)  # packed codes + scales (docs/QUANTIZED.md)
"""

from .device import Gpu, NoAdapterError, get_gpu
from .evaluate import Evaluator, Outcome, Replay
from .export import ExportError, export
from .kernel import Kernel
from .lookup import lookup, matmul
from .problem import Problem, ProblemError
from .quantize import QuantizedWeight, quantize
from .space import Config
from .tune import TuneError, TuneOptions, TuneResult, tune, tune_many
from .version import __version__ as __version__

__all__ = [
    "Config",
    "Evaluator",
    "ExportError",
    "Gpu",
    "Kernel",
    "NoAdapterError",
    "Outcome",
    "Problem",
    "ProblemError",
    "QuantizedWeight",
    "Replay",
    "TuneError",
    "TuneOptions",
    "TuneResult",
    "export",
    "get_gpu",
    "lookup",
    "matmul",
    "quantize",
    "tune",
    "tune_many",
]
