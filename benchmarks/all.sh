#!/usr/bin/env bash
# Every performance table of benchmarks/README.md in one command, on a GPU with PyTorch
# beside autotune (7.5 minutes on the H200 for the 2026-12-01 tables; nothing is tuned):
#
#   benchmarks/all.sh OUT_DIR            # e.g. benchmarks/results/2026-12-01-h200-every-shape
#   benchmarks/all.sh --quick OUT_DIR    # tiny shapes, short timings: a dry run anywhere
#
# One folder per table under OUT_DIR (bench.md / layer.md, with .json), then a summary.
# PYTHON picks the interpreter (default: python).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/_args.sh" "$@"

times=()  # "folder seconds" of each table, printed before the summary
bench() {
    local name="$1" start=$SECONDS
    shift
    "$py" "$here/bench.py" --rounds "$rounds" --out "$out/$name" "$@"
    times+=("$name $((SECONDS - start)) s")
}
layer() {
    local model="$1" dtype="$2" start=$SECONDS
    "$py" "$here/layer.py" --rounds "$rounds" --model "$here/models/$model-layer.toml" \
        --dtype "$dtype" --out "$out/layer-$model-$dtype"
    times+=("layer-$model-$dtype $((SECONDS - start)) s")
}

bench suite-f32 --set suite --checks both
bench decode-f32 --set decode --dtype f32 --checks off --no-tiled
bench decode-f16 --set decode --dtype f16 --checks off --no-tiled
bench longk-f32 --set longk --checks off --no-tiled
bench outofbox-f32 --set outofbox --checks off --no-tiled
bench odd-f32 --set odd --checks off --no-tiled
for model in llama-7b llama3-8b; do
    for dtype in f32 f16; do
        layer "$model" "$dtype"
    done
done

echo
echo "Wall time per table: ${times[*]/%/;} total ${SECONDS} s"
echo
echo "Summary ($out):"
"$py" "$here/summary.py" "$out"
