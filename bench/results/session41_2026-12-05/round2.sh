#!/usr/bin/env bash
# Session 41's part 2: the whole GPU suite on the build's defaults (~75-330 s).
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"
timeout 500 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -20
