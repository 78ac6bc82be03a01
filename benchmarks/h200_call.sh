# One device call (2026-11-30, fifth session, sixth): longer tunes (60 s of search) where the
# 12 s ones fell short: NT on the few-row shapes, f16 at 4096^3.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 200 python3 benchmarks/bench_variants.py --rows nt --tune 60 --shape 16x4096x4096 \
  --shape 64x11008x4096 --out $OUT/nt > $OUT/nt.log 2>&1
timeout 230 python3 benchmarks/bench_variants.py --rows f16 --tune 60 --shape 4096x4096x4096 \
  --out $OUT/f16 > $OUT/f16.log 2>&1
tail -4 $OUT/nt.log; tail -3 $OUT/f16.log
