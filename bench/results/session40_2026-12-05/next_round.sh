#!/usr/bin/env bash
# Prepared in session 40 for the next GPU round (build of a921aff or later, carried as usual):
# variant 32's GPU tests, its A/B against the default at d = 256 with FlashAttention-3's
# backward in the same runs, then the whole GPU suite on the defaults (not run in session 40).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 90 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "(test_hopper_backward_hd256 and atom-order) or (hd256_forms and 32)" > $OUT/tests_v32.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests_v32.txt; grep -E "^FAILED" $OUT/tests_v32.txt | head -8
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32 AB_FA3_BWD=$FA3_BWD_DIR timeout 150 python3 bwd_ab.py 0 256,2048 256,4096 256,8192 256,16384 256,2048,causal 256,8192,causal 256,4096,gqa 256,16384,causal,gqa > $OUT/ab_v32.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_v32.txt
timeout 330 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
