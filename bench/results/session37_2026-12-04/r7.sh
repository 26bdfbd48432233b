#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
GPROJ_COMMIT=$(cat _wheels/commit.txt) timeout 420 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --hdims 128 --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --out $OUT/speed_d128.json > $OUT/speed_d128.log 2>&1
echo "$(el) speed rc=$?"; tail -50 $OUT/speed_d128.log
