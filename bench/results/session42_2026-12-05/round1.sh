#!/usr/bin/env bash
# Prepared in sessions 41-42 (no GPU lent) for the next GPU round, on a build of this session's code
# (carried as _wheels/_C.so.xz, _wheels/commit.txt): first the tests of what sessions 40-41
# wrote without a GPU (variant 32; gproj's d = 256 split group; variant 33's rotated tiles; the
# item cursor in both d = 256 passes, which every d = 256 test runs), compute-sanitizer on the GQA forms, then the A/B runs
# (gproj's d = 256 GQA in 1 / 2 / 4 / 8 shares; variant 32 against the default in fa3 mode),
# FlashAttention-3's backward in the same runs. Part 2 (round2.sh): the whole GPU suite, variant
# 32 on dense d = 256 shapes and variant 23 (session 38, never measured) at d = 128 causal.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
timeout 150 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "test_gproj_backward_hd256_split_group or (test_hopper_backward_hd256 and (atom-order or default)) or (test_hopper_backward_hd256 and row-range) or (hd256_forms and (32 or 34 or 35)) or (gqa_work_orders and d256) or rotated" > $OUT/tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests.txt; grep -E "^FAILED" $OUT/tests.txt | head -8
for tool in memcheck racecheck; do
  SANITIZE_ONLY_GQA_ORDERS=1 timeout 90 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.txt 2>&1
  echo "$(el) $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.txt | tail -1)"
done
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32,34 AB_FA3_BWD=$FA3_BWD_DIR timeout 200 python3 bwd_ab.py 0,0s2,0s4,0s8 256,4096,gqa 256,16384,gqa 256,4096,causal,gqa 256,16384,causal,gqa > $OUT/ab_gqa.txt 2>&1); echo "$(el) ab gqa rc=$?"; cat $OUT/ab_gqa.txt
