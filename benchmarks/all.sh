#!/usr/bin/env bash
# Every performance table of benchmarks/README.md, on the GPU machine, in one command
# (a few minutes on the H200 with the cache warm; nothing is tuned here):
#
#   benchmarks/all.sh OUT_DIR            # e.g. benchmarks/results/2026-12-01-h200-all
#   benchmarks/all.sh --quick OUT_DIR    # tiny shapes, short timings: a dry run anywhere
#
# One folder per table under OUT_DIR (bench.md / layer.md, with .json), then a summary.
# PYTHON picks the interpreter (default: python).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${PYTHON:-python}"
rounds=3
if [[ "${1:-}" == "--quick" ]]; then
    export AUTOTUNE_BENCH_QUICK=1
    rounds=1
    shift
fi
if [[ $# -ne 1 ]]; then
    echo "usage: benchmarks/all.sh [--quick] OUT_DIR" >&2
    exit 2
fi
out="$1"
mkdir -p "$out"

bench() { "$py" "$here/bench.py" --rounds "$rounds" "$@"; }
layer() { "$py" "$here/layer.py" --rounds "$rounds" "$@"; }

bench --set suite --checks both --out "$out/suite-f32"
bench --set decode --dtype f32 --checks off --no-tiled --out "$out/decode-f32"
bench --set decode --dtype f16 --checks off --no-tiled --out "$out/decode-f16"
bench --set longk --checks off --no-tiled --out "$out/longk-f32"
bench --set outofbox --checks off --no-tiled --out "$out/outofbox-f32"
for model in llama-7b llama3-8b; do
    for dtype in f32 f16; do
        layer --model "$here/models/$model-layer.toml" --dtype "$dtype" --out "$out/layer-$model-$dtype"
    done
done

echo
echo "Summary ($out):"
"$py" "$here/summary.py" "$out"
