# Device calls (2026-11-30, fifth session, fourth and fifth): blockedx gained SWZ and three
# seeds, so its shipped entries are stale: tune the NT and f16 problems of half the suite
# (12 s of search each, checks off) and benchmark them. $2: "1" or "2" (which half).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
if [ "$2" = 1 ]; then
  SHAPES="1024x1024x1024 2048x2048x2048 4096x4096x4096 8192x8192x8192 2048x12288x4096"
else
  SHAPES="2048x11008x4096 2048x4096x11008 512x32000x4096 16x4096x4096 64x11008x4096"
fi
ARGS=$(for s in $SHAPES; do echo -n " --shape $s"; done)
timeout 280 python3 benchmarks/bench_variants.py --rows nt --tune 12 $ARGS --out $OUT/nt \
  > $OUT/nt.log 2>&1
timeout 300 python3 benchmarks/bench_variants.py --rows f16 --tune 12 $ARGS --out $OUT/f16 \
  > $OUT/f16.log 2>&1
tail -8 $OUT/nt.log; tail -8 $OUT/f16.log
