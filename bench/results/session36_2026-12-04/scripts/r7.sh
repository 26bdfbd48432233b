#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd scripts && AB_REPS=15 timeout 150 python3 fwd_ab.py 0,1 128,1024 128,1024,causal 128,2048 128,4096 128,2048,causal 128,4096,causal 128,8192,causal 128,16384,causal 128,16384,causal,gqa 128,v1024,causal 128,v4096,causal > $OUT/ab_d128_v1_gproj.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d128_v1_gproj.txt
C=$(cat _wheels/commit.txt)
GPROJ_COMMIT=$C timeout 330 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --hdims 256 --no-gqa --varlen-means "" --varlen-mixes "" --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --out $OUT/speed_d256.json > $OUT/speed_log_d256.txt 2>&1
echo "$(el) speed rc=$?"; tail -14 $OUT/speed_log_d256.txt
