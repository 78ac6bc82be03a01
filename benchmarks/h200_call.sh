# One device call (2026-11-30, sixth session, fifth): 4096^3 with 128 invocations per
# workgroup and 128 accumulators each (two workgroups per SM fit the registers, so one
# can compute while the other waits at its barrier).
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
S=4096x4096x4096
T1="VEC=4 BM=128 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
T2="VEC=4 BM=256 TM=16 BN=64 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
T3="VEC=4 BM=128 TM=8 BN=128 TN=16 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
T4="VEC=4 BM=64 TM=8 BN=256 TN=16 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
run() { name=$1; shift; timeout 200 python3 benchmarks/variants.py --shape $S --checks off "$@" > $OUT/$name.txt 2>&1; tail -n +2 $OUT/$name.txt | cut -c1-160; }
run t128 --config "$T1" --config "$T2" --config "$T3" --config "$T4" --vary DB=1,2 --vary WARP=0,1
