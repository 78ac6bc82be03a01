# One device call (2026-11-30, sixth session, third): the 4096^3 kernels with the operands
# of step s + 1 read from workgroup memory before the FMAs of step s (benchmarks/pipe.diff).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
S=4096x4096x4096
B256="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
B128="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=1"
run() { name=$1; shift; timeout 150 python3 benchmarks/variants.py --shape $S --checks off "$@" > $OUT/$name.txt 2>&1; tail -n +2 $OUT/$name.txt | cut -c1-160; }
patch -p1 < benchmarks/pipe.diff
run pipe --config "$B256" --config "$B128" --vary DB=1,2
