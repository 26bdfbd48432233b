#!/usr/bin/env bash
# Session 40 round 6: the whole GPU suite on 00be735's defaults (d = 256 GQA per query head).
source scripts/device_prelude.sh
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider -x > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
