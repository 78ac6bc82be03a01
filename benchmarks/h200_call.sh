# One device call (2026-11-30, fourth session, third): `blocked` with DB=2 and WARP
# re-tuned (20 s of search per shape and mode) and benchmarked on the first half of the
# suite; the second half and the joined table are the next call.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 570 python3 benchmarks/bench.py --tune 20 --out $OUT/part1 \
  --shape 4096x4096x4096 --shape 8192x8192x8192 --shape 2048x12288x4096 \
  --shape 2048x11008x4096 --shape 2048x4096x11008 > $OUT/part1.log 2>&1
grep tuned $OUT/part1.log; cat $OUT/part1/bench.md
