#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -3 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
(cd scripts && AB_REPS=15 timeout 120 python3 fwd_ab.py 0,8,9 128,2048,causal 128,4096,causal 128,8192,causal 128,16384,causal 128,4096,causal,gqa 128,16384,causal,gqa 128,2048 > $OUT/ab_d128_gproj_causal_default.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d128_gproj_causal_default.txt
