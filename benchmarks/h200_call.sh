# One device call (2026-11-30, third session, last): the peak vec4 fma rate in f32 and
# f16, then f16 at 4096^3 tuned for 20 s per accumulation, and its benchmark row.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 30 python3 benchmarks/peak.py > $OUT/peak.txt 2>&1
timeout 110 python3 benchmarks/bench_variants.py --rows f16 --tune 20 --out $OUT/f16 --shape 4096x4096x4096 > $OUT/run.log 2>&1
cat $OUT/peak.txt $OUT/f16/bench.md
