# One device call (2026-11-30, fifth session, first): (1) the shipped 4096^3 kernels against
# cuBLAS in 7 alternating rounds; (2) with benchmarks/exp-swz.diff applied (a staging order
# whose workgroup-memory stores are free of bank conflicts, SWZ=1), blocked f32 and
# blockedx NT and f16 (f32 accumulation) at 4096^3, with BK=16 and 32.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
timeout 150 python3 benchmarks/bench.py --rounds 7 --shape 4096x4096x4096 --out $OUT/rounds \
  > $OUT/rounds.txt 2>&1
rm -f $OUT/rounds/bench.png
patch -p1 < benchmarks/exp-swz.diff > /dev/null || exit 1
export AUTOTUNE_COMMIT=$1+exp-swz
S=4096x4096x4096
C128="VEC=4 BM=128 TM=8 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1"
C256="VEC=4 BM=256 TM=16 BN=128 TN=8 BK=16 PAD=0 UNROLL=1 AT=1 GROUP=1"
timeout 120 python3 benchmarks/variants.py --shape $S --checks off \
  --config "$C256 DB=2 WARP=0" --config "$C128 DB=2 WARP=1" --config "$C128 DB=1 WARP=0" \
  --vary SWZ=0,1 > $OUT/blocked.txt 2>&1
timeout 180 python3 benchmarks/variants.py --template blockedx --layout nt --shape $S \
  --checks off --config "$C128 DB=1 ACC=0" --config "$C256 DB=1 ACC=0" \
  --vary SWZ=0,1 --vary BK=16,32 > $OUT/nt.txt 2>&1
timeout 150 python3 benchmarks/variants.py --template blockedx --dtype f16 --accumulate f32 \
  --shape $S --checks off --config "$C128 DB=1 ACC=0" --config "$C256 DB=1 ACC=0" \
  --vary SWZ=0,1 --vary BK=16,32 > $OUT/f16.txt 2>&1
tail -3 $OUT/rounds.txt; for f in blocked nt f16; do echo "== $f"; cut -c1-200 $OUT/$f.txt | sed 's/blockedx\? //'; done
