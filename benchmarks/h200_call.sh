# One device call (2026-11-30, third session): tune and benchmark the f16 and NT rows of
# the suite into $OUT/c (at most 8 files come back from $OUT).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
SUITE="--shape 4096x4096x4096 --shape 2048x12288x4096 --shape 2048x11008x4096 --shape 2048x4096x11008
 --shape 512x32000x4096 --shape 1024x1024x1024 --shape 2048x2048x2048 --shape 16x4096x4096
 --shape 64x11008x4096 --shape 8192x8192x8192"
timeout 345 python3 benchmarks/bench_variants.py --rows f16 --tune 6 --out $OUT/f16 $SUITE > $OUT/run.log 2>&1
timeout 200 python3 benchmarks/bench_variants.py --rows nt --tune 6 --out $OUT/nt $SUITE >> $OUT/run.log 2>&1
cat $OUT/f16/bench.md $OUT/nt/bench.md
