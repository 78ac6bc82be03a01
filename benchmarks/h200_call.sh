# One device call (2026-11-30, fourth session, fourth): the second half of the suite
# tuned (20 s of search per shape and mode) and benchmarked, then one table of both halves
# (the first half's results are in the repository: session4/part1).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c $OUT/part2
cp cache/nvidia-h200-*.json $OUT/c/
timeout 540 python3 benchmarks/bench.py --tune 20 --out /tmp/part2 \
  --shape 512x32000x4096 --shape 1024x1024x1024 --shape 2048x2048x2048 \
  --shape 16x4096x4096 --shape 64x11008x4096 > $OUT/part2.log 2>&1
cp /tmp/part2/bench.json $OUT/part2/
python3 benchmarks/bench.py --join benchmarks/results/h200-2026-11-30-session4/part1 /tmp/part2 \
  --out $OUT/suite > /dev/null 2>&1
grep tuned $OUT/part2.log; cat $OUT/suite/bench.md
