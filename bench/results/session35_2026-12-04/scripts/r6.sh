#!/usr/bin/env bash
source scripts/device_prelude.sh
if [ 0 = 0 ]; then
  timeout 100 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider 2>&1 | tail -4 > $OUT/gpu_suite_final.txt
  echo "$(el) suite"; cat $OUT/gpu_suite_final.txt
fi
C=$(cat _wheels/commit.txt)
GPROJ_COMMIT=$C timeout 490 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --shard 0/2 --out $OUT/speed_p0.json > $OUT/speed_log_p0.txt 2>&1
echo "$(el) speed rc=$?"; tail -3 $OUT/speed_log_p0.txt
