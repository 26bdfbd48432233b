#!/usr/bin/env bash
source scripts/device_prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider -x > $OUT/suite.log 2>&1
echo "$(el) suite rc=$?"; tail -3 $OUT/suite.log
cd scripts
AB_REPS=15 timeout 200 python3 fwd_ab.py 0,4,9 128,2048 128,4096 128,8192 128,16384 > $OUT/ab_v049.txt 2>&1
echo "$(el) ab rc=$?"; cat $OUT/ab_v049.txt | tail -40
timeout 120 python3 energy_probe.py --seconds 2 --env GPROJ_FWD_VARIANT=-,4,9 128,2048 128,8192 > $OUT/energy_v049.txt 2>&1
echo "$(el) energy rc=$?"; tail -30 $OUT/energy_v049.txt
