#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 110 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider 2>&1 | tail -3 > $OUT/gpu_suite_host.txt
echo "$(el) suite"; cat $OUT/gpu_suite_host.txt
timeout 40 python3 _wheels/host_old_new.py > $OUT/host_old_new.txt 2>&1; echo "$(el) rc=$?"; cat $OUT/host_old_new.txt
timeout 60 python3 scripts/host_cost.py > $OUT/host_cost.txt 2>&1; echo "$(el) rc=$?"; head -4 $OUT/host_cost.txt
