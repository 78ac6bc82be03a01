# One device call (2026-11-30, fifth session, third): with benchmarks/exp-swz.diff applied,
# blockedx at 4096^3 for f16 (f32 accumulation), NT and f32 NN (alpha epilogue: the
# variant template on the plain layout), three tiles, BK=16/32, SWZ=0/1.
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1+exp-swz AUTOTUNE_CACHE=$OUT/c
mkdir -p $OUT/c
patch -p1 < benchmarks/exp-swz.diff > /dev/null || exit 1
S=4096x4096x4096
X="PAD=0 UNROLL=1 AT=1 GROUP=1 DB=1 ACC=0 VEC=4"
C128="$X BM=128 TM=8 BN=128 TN=8"
C256="$X BM=256 TM=16 BN=128 TN=8"
C128W="$X BM=128 TM=8 BN=256 TN=16"
for row in "f16:--dtype f16 --accumulate f32" "nt:--layout nt" "nn:--epilogue alpha"; do
  timeout 170 python3 benchmarks/variants.py --template blockedx ${row#*:} --shape $S \
    --checks off --config "$C128" --config "$C256" --config "$C128W" \
    --vary BK=16,32 --vary SWZ=0,1 > $OUT/${row%%:*}.txt 2>&1
done
for f in f16 nt nn; do echo "== $f"; cut -c1-200 $OUT/$f.txt | sed 's/blockedx ACC=0 AT=1 //; s/GROUP=1 PAD=0 //; s/UNROLL=1 VEC=4//'; done
