#!/usr/bin/env bash
source scripts/device_prelude.sh
lscpu | grep -E "Model name|^CPU\(s\)|MHz" | head -4
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
timeout 150 python3 scripts/host_profile.py > $OUT/host_profile.txt 2>&1
echo "$(el) host_profile rc=$?"
timeout 120 python3 scripts/host_cost.py > $OUT/host_cost.txt 2>&1
echo "$(el) host_cost rc=$?"; head -4 $OUT/host_cost.txt
(cd scripts && timeout 150 python3 gqa_bwd_probe.py > $OUT/gqa_bwd_probe.txt 2>&1; echo "$(el) gqa rc=$?")
grep -E "==|ms  \(" $OUT/gqa_bwd_probe.txt
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -3 $OUT/gpu_suite.txt
sed -n '/== summary/,$p' $OUT/host_profile.txt
