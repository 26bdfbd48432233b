#!/usr/bin/env bash
source scripts/device_prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/gpu.txt 2>&1
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
timeout 60 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "causal_beyond_8k or d128_pingpong" > $OUT/new_test.txt 2>&1; echo "$(el) new rc=$?"; tail -1 $OUT/new_test.txt
