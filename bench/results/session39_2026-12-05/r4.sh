#!/usr/bin/env bash
# Session 39, round 3 (session 39's defaults: d = 64 variant 27's form, d = 256 variant 30's,
# d = 128 causal GQA in two shares): the whole GPU suite, compute-sanitizer on the new forms, and
# the defaults against the forms before (variant 31, one block per group: 0s1).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
timeout 330 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
for tool in memcheck racecheck; do
  SANITIZE_ONLY_GQA_ORDERS=1 timeout 75 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.log 2>&1
  echo "$(el) compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.log | tail -1)"
done
(cd scripts && AB_REPS=7 AB_FA3_VARIANTS=0,31,0s1 AB_FA3_BWD=$FA3_BWD_DIR timeout 80 python3 bwd_ab.py 0 64,8192 128,4096,causal,gqa 128,16384,causal,gqa 256,8192 256,4096,causal > $OUT/ab_defaults.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_defaults.txt
