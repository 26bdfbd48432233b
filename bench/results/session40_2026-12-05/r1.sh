#!/usr/bin/env bash
# Session 40, round 1 (d = 256's split group in the transposed pass): its GPU tests,
# compute-sanitizer on the GQA forms (now with d = 256 shares), the A/B of 1 / 2 / 4 / 8 shares at
# d = 256 GQA (8 heads on 1 kv head) with FlashAttention-3's backward in the same runs.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 150 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "gqa_work_orders or (test_hopper_backward_hd256 and fa3) or hd256_forms" > $OUT/tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests.txt; grep -E "^FAILED|Error" $OUT/tests.txt | head -8
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,0s2,0s4,0s8 AB_FA3_BWD=$FA3_BWD_DIR timeout 170 python3 bwd_ab.py 0 256,2048,gqa 256,4096,gqa 256,16384,gqa 256,2048,causal,gqa 256,4096,causal,gqa 256,16384,causal,gqa > $OUT/ab_d256_gqa.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_d256_gqa.txt
for tool in memcheck racecheck; do
  SANITIZE_ONLY_GQA_ORDERS=1 timeout 100 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.log 2>&1
  echo "$(el) compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.log | tail -1)"
done
