#!/usr/bin/env bash
# Session 42, as run (call A): the GPU tests of sessions 40-42's unmeasured forms (round1.sh's),
# then the d = 256 forms' A/B (round2.sh's) and variant 23's (round3.sh's). The whole GPU suite is
# left out for device time (the build's other kernels are unchanged since its last full run).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
timeout 200 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "test_gproj_backward_hd256_split_group or (test_hopper_backward_hd256 and (atom-order or default)) or (test_hopper_backward_hd256 and (row-range or hoisted)) or (hd256_forms and (32 or 34 or 35 or 36)) or (gqa_work_orders and d256) or rotated or rows_by_all_warps or (test_hopper_kv_backward and rows-by-all-warps)" > $OUT/tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests.txt; grep -E "^FAILED" $OUT/tests.txt | head -8
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32,34,35,36 AB_FA3_BWD=$FA3_BWD_DIR timeout 230 python3 bwd_ab.py 0 256,2048 256,8192 256,16384 256,2048,causal 256,4096,causal 256,8192,causal > $OUT/ab_v32.txt 2>&1); echo "$(el) ab v32 rc=$?"; cat $OUT/ab_v32.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,23 AB_FA3_BWD=$FA3_BWD_DIR timeout 80 python3 bwd_ab.py 0 128,2048,causal 128,4096,causal 128,8192,causal > $OUT/ab_v23.txt 2>&1); echo "$(el) ab v23 rc=$?"; cat $OUT/ab_v23.txt
