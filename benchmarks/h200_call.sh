# One device call (2026-11-30, sixth session, fourth): 32-deep slices with one workgroup
# buffer at 4096^3 (256x128 fills the 48 KiB exactly), f16 inputs with f32 accumulation on
# the f32 kernel's geometry, then the shipped 4096^3 entries against cuBLAS in 9 rounds.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
S=4096x4096x4096
B256="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=32 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=1 WARP=0"
B128="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=32 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=1 WARP=1"
H256="ACC=0 AT=1 BK=16 BM=256 BN=128 DB=1 GROUP=1 PAD=0 SWZ=0 TM=16 TN=8 UNROLL=1 VEC=4"
run() { name=$1; shift; timeout 150 python3 benchmarks/variants.py --shape $S --checks off "$@" > $OUT/$name.txt 2>&1; tail -n +2 $OUT/$name.txt | cut -c1-160; }
run bk32 --config "$B256" --config "$B128" --vary WARP=0,1
run f16acc32 --template blockedx --dtype f16 --accumulate f32 --config "$H256" --vary BK=16,32 --vary SWZ=0,1
timeout 240 python3 benchmarks/bench.py --rounds 9 --shape $S --out $OUT/r9 > $OUT/r9.txt 2>&1
tail -n 12 $OUT/r9.txt
