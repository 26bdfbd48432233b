#!/usr/bin/env bash
# Session 42, as run (call C), on the build with the new defaults (fa3 mode: d = 128's diagonal
# tiles by row ranges, variant 23's form; d = 256 variant 36's form; gproj d = 256 GQA under a
# causal-like mask in shares of two query heads): the whole GPU suite, then compute-sanitizer
# memcheck and racecheck on the Hopper backward's default passes (SANITIZE_ONLY_HOPPER_BWD).
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"
timeout 320 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -20
for tool in memcheck racecheck; do
  SANITIZE_ONLY_HOPPER_BWD=1 timeout 120 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.txt 2>&1
  echo "$(el) $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.txt | tail -1)"
done
