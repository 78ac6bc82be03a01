#!/usr/bin/env bash
# The quantized-weight tables of benchmarks/README.md in one command, on a GPU with PyTorch
# beside autotune (about 6 minutes on the H200; nothing is tuned: the shipped cache/ and
# lookup's estimates serve every row). cuBLAS runs SGEMM on the unquantized f32 weight.
#
#   benchmarks/quantized.sh OUT_DIR    # e.g. benchmarks/results/2026-12-01-h200-quantized
#   benchmarks/quantized.sh --quick OUT_DIR
#
# PYTHON picks the interpreter (default: python).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_args.sh" "$@"
bench() {
    local name="$1"
    shift
    "$py" "$here/bench.py" --rounds "$rounds" --checks off --no-tiled --out "$out/$name" "$@"
}
gemm=(--layout nt --shape 4096x4096x4096 --shape 2048x12288x4096 --shape 2048x11008x4096)
bench decode-q4g128 --set decode --weights q4g128
bench decode-q4g128-a8 --set decode --weights q4g128 --activations q8
bench int8-gemm "${gemm[@]}" --weights q8 --activations q8
bench q4-prefill --layout nt --shape 2048x4096x4096 --weights q4g128
bench q4-prefill-a8 --layout nt --shape 2048x4096x4096 --weights q4g128 --activations q8
"$py" "$here/summary.py" "$out"
