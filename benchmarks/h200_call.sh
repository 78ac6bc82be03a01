# One device call (2026-11-30, fourth session, eighth): is 20 s of search the limit at
# 4096^3? A 90 s tune (checks off, fresh cache), then its row in the benchmark.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 150 python3 -m autotune tune --shape 4096x4096x4096 --checks off --timeout 90 \
  --template blocked > $OUT/tune.txt 2>&1
timeout 60 python3 benchmarks/bench.py --shape 4096x4096x4096 --out /tmp/b > $OUT/bench.txt 2>&1
tail -25 $OUT/tune.txt; tail -4 $OUT/bench.txt
