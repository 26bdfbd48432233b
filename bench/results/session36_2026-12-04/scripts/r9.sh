#!/usr/bin/env bash
source scripts/device_prelude.sh
C=$(cat _wheels/commit.txt)
GPROJ_COMMIT=$C timeout 560 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --hdims 128 --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --out $OUT/speed_d128.json > $OUT/speed_log_d128.txt 2>&1
echo "$(el) speed rc=$?"; tail -30 $OUT/speed_log_d128.txt
