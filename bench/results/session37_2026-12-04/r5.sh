#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 120 python3 -m pytest tests/test_gpu.py -q -x -p no:cacheprovider -k "test_hopper_kv_backward and 128 and fa3" > $OUT/kv_tests.txt 2>&1; echo "$(el) kv tests rc=$?"; tail -1 $OUT/kv_tests.txt; grep -E "^FAILED|Error" $OUT/kv_tests.txt | head -5
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,18 AB_FA3_BWD=$FA3_BWD_DIR timeout 200 python3 bwd_ab.py 0 128,2048 128,2048,causal 128,8192 128,8192,causal 128,16384 128,16384,causal 128,4096,gqa 128,4096,causal,gqa > $OUT/ab_r5.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_r5.txt
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
