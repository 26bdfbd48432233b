#!/usr/bin/env bash
# Prepared in sessions 41-42 (no GPU lent) for the next GPU round, on a build of this session's code
# (carried as _wheels/_C.so.xz, _wheels/commit.txt): first the tests of what sessions 40-41
# wrote without a GPU (variant 32; gproj's d = 256 split group; variant 33's rotated tiles; the
# item cursor in both d = 256 passes, which every d = 256 test runs; session 42's variants 34-37),
# then compute-sanitizer on the GQA forms. Round 2: the whole GPU suite and the d = 256 forms'
# A/B; round 3: the GQA A/B at d = 256 (gproj's split group), variants 23 and 33; round 4: d = 64
# kernel by kernel; round 5: ncu at d = 64.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
timeout 200 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "test_gproj_backward_hd256_split_group or (test_hopper_backward_hd256 and (atom-order or default)) or (test_hopper_backward_hd256 and (row-range or hoisted)) or (hd256_forms and (32 or 34 or 35 or 36)) or (gqa_work_orders and d256) or rotated or rows_by_all_warps or (test_hopper_kv_backward and rows-by-all-warps)" > $OUT/tests.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests.txt; grep -E "^FAILED" $OUT/tests.txt | head -8
for tool in memcheck racecheck; do
  SANITIZE_ONLY_GQA_ORDERS=1 timeout 90 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.txt 2>&1
  echo "$(el) $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.txt | tail -1)"
done
