#!/usr/bin/env bash
# Session 39's A/B forms (variants 24-28: release points, d = 64's dS~ addresses, d = 256's P under
# dP): their GPU tests, then interleaved A/B against the default and FlashAttention-3's backward
# on dense shapes at every head dim (~9 min).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 140 python3 -m pytest tests/test_gpu.py -q -x -p no:cacheprovider -k "release_points or p_under_dp or (test_hopper_kv_backward and fa3-bf16 and (stage-freed or do-ring or ds-by-address or freed-at-end)) or (test_hopper_backward_hd256 and fa3-bf16 and p-under-dp)" > $OUT/r0_tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/r0_tests.txt; grep -E "^FAILED|Error" $OUT/r0_tests.txt | head -5
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,24,25,26,27 AB_FA3_BWD=$FA3_BWD_DIR timeout 170 python3 bwd_ab.py 0 64,2048 64,4096,causal 64,8192 64,16384,causal > $OUT/ab_d64.txt 2>&1); echo "$(el) ab d64 rc=$?"; cat $OUT/ab_d64.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,24,25 AB_FA3_BWD=$FA3_BWD_DIR timeout 130 python3 bwd_ab.py 0 128,2048 128,8192 128,4096,causal 128,16384,causal > $OUT/ab_d128.txt 2>&1); echo "$(el) ab d128 rc=$?"; cat $OUT/ab_d128.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,28 AB_FA3_BWD=$FA3_BWD_DIR timeout 110 python3 bwd_ab.py 0 256,2048 256,8192 256,4096,causal 256,16384,causal > $OUT/ab_d256.txt 2>&1); echo "$(el) ab d256 rc=$?"; cat $OUT/ab_d256.txt
