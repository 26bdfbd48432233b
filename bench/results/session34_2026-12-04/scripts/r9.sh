#!/usr/bin/env bash
source scripts/device_prelude.sh
for W in 0 0.3; do
  for HS in "128 2048" "64 8192"; do
    set -- $HS
    timeout 100 python3 bench/speed.py --ops fwd --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,fa3 --hdims $1 --seqlens $2 --no-gqa --varlen-means '' --varlen-mixes '' --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s $W --out $OUT/warm${W}_d$1.json > $OUT/warm${W}_d$1.log 2>&1
    echo "$(el) warm $W d $1 rc=$?"
  done
done
grep -h "round" $OUT/warm*.log | head -100
