# One device call (2026-11-30, sixth session, first): f16 packing (peak.py, fma and
# mul-add forms), GROUP with two workgroup buffers at 4096^3, and the GEMM kernels with
# their fma written as multiply-add (benchmarks/muladd.diff), f32 and f16 accumulation.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
S=4096x4096x4096
B256="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
B128="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=1"
H64="ACC=1 AT=0 BK=16 BM=64 BN=128 DB=1 GROUP=16 PAD=1 SWZ=0 TM=8 TN=16 UNROLL=1 VEC=4"
H128="ACC=1 AT=1 BK=16 BM=128 BN=128 DB=1 GROUP=4 PAD=0 SWZ=0 TM=8 TN=8 UNROLL=1 VEC=4"
H256="ACC=1 AT=1 BK=16 BM=256 BN=128 DB=1 GROUP=4 PAD=0 SWZ=0 TM=16 TN=8 UNROLL=1 VEC=4"
F16="--template blockedx --dtype f16 --accumulate f16"
run() { name=$1; shift; timeout 120 python3 benchmarks/variants.py --shape $S --checks off "$@" > $OUT/$name.txt 2>&1; tail -n 4 $OUT/$name.txt | cut -c1-160; }
timeout 90 python3 benchmarks/peak.py > $OUT/peak.txt 2>&1; cat $OUT/peak.txt
run group --config "$B256" --config "$B128" --vary GROUP=1,4
run f16 $F16 --config "$H64" --config "$H128" --config "$H256"
patch -p1 < benchmarks/muladd.diff
run madd32 --config "$B256" --config "$B128"
run madd16 $F16 --config "$H64" --config "$H128" --config "$H256"
