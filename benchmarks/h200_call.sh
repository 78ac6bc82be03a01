# One device call (2026-11-30, fifth session, second): the whole suite on the shipped cache,
# cuBLAS and our kernels timed in 5 alternating rounds (median of the rounds' ratios).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 560 python3 benchmarks/bench.py --rounds 5 --out $OUT/suite > $OUT/suite.log 2>&1
tail -16 $OUT/suite.log
