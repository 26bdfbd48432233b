#!/usr/bin/env bash
# Session 39, round 2 (build 20d9f70: d = 64's dS~ stores fixed, d = 256's variants 29 / 30): the new forms' GPU tests, the
# d = 64 A/B again, then session 38's GQA orders (r1.sh's A/B and per-kernel times).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 170 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "release_points or (test_hopper_kv_backward and fa3 and (stage-freed or do-ring or ds-by-address or freed-at-end)) or gqa_work_orders or (test_hopper_kv_backward and fa3 and (tiles-outer or per-query-head or row-range-mask-128)) or hd256_forms or (test_hopper_backward_hd256 and fa3-bf16 and (p-under-dp or stores-by-address))" > $OUT/r0b_tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/r0b_tests.txt; grep -E "^FAILED" $OUT/r0b_tests.txt | head -8
(cd scripts && AB_REPS=11 AB_FA3_VARIANTS=0,24,26,27 AB_FA3_BWD=$FA3_BWD_DIR timeout 150 python3 bwd_ab.py 0 64,2048 64,2048,causal 64,4096 64,8192,causal 64,16384 64,4096,gqa 64,4096,causal,gqa > $OUT/ab_d64b.txt 2>&1); echo "$(el) ab d64 rc=$?"; cat $OUT/ab_d64b.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,20,22,0s2,0s4,20s2 AB_FA3_BWD=$FA3_BWD_DIR timeout 150 python3 bwd_ab.py 0 128,2048,causal,gqa 128,4096,causal,gqa 128,16384,causal,gqa 128,4096,gqa 128,16384,gqa 64,4096,causal,gqa > $OUT/ab_gqa.txt 2>&1); echo "$(el) ab gqa rc=$?"; cat $OUT/ab_gqa.txt
(cd scripts && KERNELS=1 AB_REPS=3 AB_FA3_VARIANTS=0,20,22 timeout 60 python3 bwd_ab.py 0 128,4096,causal,gqa > $OUT/kernels_gqa.txt 2>&1); echo "$(el) kernels rc=$?"; cat $OUT/kernels_gqa.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,28,29,30 AB_FA3_BWD=$FA3_BWD_DIR timeout 120 python3 bwd_ab.py 0 256,2048 256,8192 256,4096,causal 256,16384,causal 256,4096,gqa > $OUT/ab_d256b.txt 2>&1); echo "$(el) ab d256 rc=$?"; cat $OUT/ab_d256b.txt
