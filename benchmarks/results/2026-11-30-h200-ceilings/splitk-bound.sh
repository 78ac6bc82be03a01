# How fast could split-K make the few-row shapes? (2026-11-30, commit 169aaa8; its output
# is splitk.txt beside this script.) A split of K into S parts runs the workgroups of an
# (S*M) x N x (K/S) GEMM (same tiles, same depth each), so those shapes' speed bounds what
# split-K would reach before its reduction (which adds a pass over S partial C's: a few
# microseconds).
#
#     OUT=/tmp/splitk bash benchmarks/results/2026-11-30-h200-ceilings/splitk-bound.sh COMMIT
#
# run from the repository root on the H200, with OUT an existing folder for the output.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
C1="VEC=4 BM=64 TM=16 BN=128 TN=4 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=1 WARP=0"
C2="VEC=4 BM=64 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=1 WARP=0"
C3="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1 DB=2 WARP=1"
C4="VEC=4 BM=32 TM=4 BN=64 TN=4 BK=32 PAD=1 UNROLL=1 AT=0 GROUP=1 DB=1 WARP=0"
C5="VEC=4 BM=16 TM=2 BN=32 TN=4 BK=32 PAD=1 UNROLL=1 AT=0 GROUP=1 DB=1 WARP=1"
timeout 500 python3 benchmarks/variants.py --checks off \
  --shape 64x11008x4096 --shape 128x11008x2048 --shape 256x11008x1024 --shape 512x11008x512 \
  --shape 16x4096x4096 --shape 64x4096x1024 --shape 128x4096x512 \
  --config "$C1" --config "$C2" --config "$C3" --config "$C4" --config "$C5" > $OUT/splitk.txt 2>&1
cut -c1-150 $OUT/splitk.txt
