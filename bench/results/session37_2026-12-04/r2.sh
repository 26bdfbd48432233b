#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
(cd _wheels/fa3bwd_run && timeout 150 python3 check.py) > $OUT/fa3bwd_check.txt 2>&1; echo "$(el) check rc=$?"; tail -16 $OUT/fa3bwd_check.txt
timeout 100 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "test_hopper_kv_backward and (p-under or lse2-rows or fa3-order)" > $OUT/variants_tests.txt 2>&1; echo "$(el) var tests rc=$?"; tail -1 $OUT/variants_tests.txt; grep FAILED $OUT/variants_tests.txt | head -5
cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,18,19,20 AB_FA3_BWD=../_wheels/fa3bwd_run timeout 260 python3 bwd_ab.py 0 128,2048 128,2048,causal 128,8192 128,8192,causal 64,4096 64,4096,causal 256,4096 256,4096,causal > $OUT/ab_fa3_vs_ours.txt 2>&1; echo "$(el) ab rc=$?"; cat $OUT/ab_fa3_vs_ours.txt
