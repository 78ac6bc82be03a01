# One device call (2026-11-30, fifth session, seventh): is 4096^3 losing to a partial last
# wave? 256x128 tiles give 512 workgroups on 132 SMs (3.9 waves at one per SM); 4096x4224x4096
# gives 528 (4 full waves). Same config, both shapes, next to cuBLAS.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
C="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=0"
timeout 150 python3 benchmarks/variants.py --shape 4096x4096x4096 --shape 4096x4224x4096 \
  --shape 4096x3968x4096 --checks off --config "$C" > $OUT/waves.txt 2>&1
cat $OUT/waves.txt | cut -c1-150
