# One device call (2026-11-30, sixth session, second): parameter flips of the 4096^3
# kernel (unrolling, slice depth, warp patches, the f16 winner's geometry in f32) and the
# two-buffer loop without tests in its body (benchmarks/peel.diff).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
S=4096x4096x4096
B256="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
B128="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=1"
B1x2="VEC=4 BM=128 TM=8 BN=256 TN=16 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
F64="VEC=4 BM=64 TM=8 BN=128 TN=16 BK=16 PAD=1 UNROLL=1 AT=0 GROUP=16 DB=1 WARP=0"
run() { name=$1; shift; timeout 150 python3 benchmarks/variants.py --shape $S --checks off "$@" > $OUT/$name.txt 2>&1; tail -n +2 $OUT/$name.txt | cut -c1-160; }
run flips --config "$B256" --vary UNROLL=0,1 --vary BK=8,16 --vary WARP=0,1
run geom --config "$B1x2" --config "$F64" --vary DB=1,2 --vary AT=0,1
patch -p1 < benchmarks/peel.diff
run peel --config "$B256" --config "$B128" --vary WARP=0,1
