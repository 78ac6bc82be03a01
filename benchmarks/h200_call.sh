# one device call: issue 8 throughput and regret, f16 config exploration, NT rows
export AUTOTUNE_ADAPTER=nvidia AUTOTUNE_COMMIT=$1 AUTOTUNE_CACHE=$OUT/cache
mkdir -p $OUT/cache
S4=4096x4096x4096
timeout 75 python3 benchmarks/throughput.py --shape $S4 --timeout 25 --ahead 0 1 > $OUT/throughput.txt 2>&1
timeout 50 python3 benchmarks/regret.py --leave-one-out cache --out $OUT/regret-off.json > $OUT/regret-off.txt 2>&1
timeout 110 python3 benchmarks/variants.py --template blockedx --dtype f16 --accumulate f16 --checks off --shape $S4 \
  --config "VEC=4 AT=1 PAD=0 UNROLL=1 GROUP=1 ACC=1 BM=128 BN=128 TM=8 TN=8 BK=16 DB=1" \
  --vary BM=64,128 --vary BN=128,256 --vary TM=8,16 --vary TN=8,16 --vary BK=16,32 --vary DB=0,1 \
  --out $OUT/f16acc16.json > $OUT/f16acc16.txt 2>&1
timeout 40 python3 benchmarks/variants.py --template blockedx --dtype f16 --accumulate f32 --checks off --shape $S4 \
  --config "VEC=4 AT=1 PAD=1 UNROLL=1 GROUP=4 ACC=0 BM=128 BN=128 TM=8 TN=8 BK=16 DB=1" \
  --vary PAD=0,1 --vary DB=0,1 --vary BM=64,128 --out $OUT/f16acc32.json > $OUT/f16acc32.txt 2>&1
timeout 25 python3 benchmarks/variants.py --checks off --shape $S4 \
  --config "VEC=4 AT=1 PAD=1 UNROLL=1 GROUP=4 BM=128 BN=128 TM=8 TN=8 BK=16 DB=1" \
  --vary PAD=0,1 --vary DB=0,1 --vary BM=64,128 --out $OUT/f32.json > $OUT/f32.txt 2>&1
timeout 230 python3 benchmarks/bench_variants.py --rows nt --tune 8 --out $OUT/nt \
  --shape $S4 --shape 2048x12288x4096 --shape 2048x11008x4096 --shape 2048x4096x11008 --shape 512x32000x4096 \
  --shape 1024x1024x1024 --shape 2048x2048x2048 --shape 16x4096x4096 --shape 64x11008x4096 --shape 8192x8192x8192 \
  > $OUT/nt.log 2>&1
for f in throughput.txt regret-off.txt; do echo "== $f"; grep -v "━" $OUT/$f | tail -13; done
for f in f16acc16.txt f16acc32.txt f32.txt; do echo "== $f"; grep nochecks $OUT/$f | awk '{print $(NF-1), $0}' | sort -n | tail -6 | cut -c1-150; done
echo "== nt"; tail -14 $OUT/nt/bench.md
