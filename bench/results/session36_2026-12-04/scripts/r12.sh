#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
(cd scripts && AB_REPS=15 timeout 40 python3 fwd_ab.py 0,9 128,16384,causal 128,12288,causal > $OUT/ab_d128_causal_long_default.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d128_causal_long_default.txt
