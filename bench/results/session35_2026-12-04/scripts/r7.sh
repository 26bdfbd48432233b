#!/usr/bin/env bash
source scripts/device_prelude.sh
if [ 1 = 0 ]; then
  timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider 2>&1 | tail -4 > $OUT/gpu_suite_final.txt
  echo "$(el) suite"; cat $OUT/gpu_suite_final.txt
fi
timeout 110 compute-sanitizer --tool memcheck --print-limit 5 python3 _wheels/memcheck_slots.py > $OUT/memcheck_slots.txt 2>&1
echo "$(el) memcheck rc=$?"; tail -3 $OUT/memcheck_slots.txt
C=$(cat _wheels/commit.txt)
GPROJ_COMMIT=$C timeout 470 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --shard 1/2 --out $OUT/speed_p1.json > $OUT/speed_log_p1.txt 2>&1
echo "$(el) speed rc=$?"; tail -3 $OUT/speed_log_p1.txt
