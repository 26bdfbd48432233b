#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 120 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "grouped_grid or (test_hopper_kv_backward and fa3-bf16 and causal)" > $OUT/r6_tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/r6_tests.txt; grep -E "^FAILED|Error" $OUT/r6_tests.txt | head -5
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,19 AB_FA3_BWD=$FA3_BWD_DIR timeout 240 python3 bwd_ab.py 0 128,2048,causal 128,4096,causal 128,8192,causal 128,16384,causal 64,2048,causal 64,8192,causal 128,4096,causal,gqa 128,2048 > $OUT/ab_r6.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_r6.txt
