# Device calls (2026-11-30, sixth session, sixth and seventh): the suite on the shipped
# cache in 9 alternating rounds, in two halves (argument 2: first or second).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
if [ "$2" = first ]; then
  SHAPES="--shape 1024x1024x1024 --shape 2048x2048x2048 --shape 4096x4096x4096 --shape 8192x8192x8192 --shape 16x4096x4096"
else
  SHAPES="--shape 2048x12288x4096 --shape 2048x11008x4096 --shape 2048x4096x11008 --shape 512x32000x4096 --shape 64x11008x4096"
fi
timeout 570 python3 benchmarks/bench.py --rounds 9 $SHAPES --out $OUT/suite-$2 > $OUT/suite-$2.log 2>&1
tail -12 $OUT/suite-$2.log
