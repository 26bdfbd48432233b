#!/usr/bin/env bash
# Session 45 (prepared): backward variant 40 (fa3 mode, d = 128: the default 64-row pass with each
# tile's lse2 read before the wait for S). ~5 device minutes. Needs the build of the commit that
# adds it (_wheels/commit.txt says which). Prediction: -1 to -4% at d = 128 under every mask, dK
# and dV bitwise the default's.
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run.
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"; nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
timeout 150 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "lse2-early" > $OUT/tests_v40.txt 2>&1
echo "$(el) tests rc=$?"; tail -2 $OUT/tests_v40.txt; grep -E "^FAILED" $OUT/tests_v40.txt | head
for tool in memcheck racecheck; do
  SANITIZE_ONLY_GQA_ORDERS=1 SANITIZE_VARIANTS=40 timeout 60 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_v40_$tool.txt 2>&1
  echo "$(el) v40 $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_v40_$tool.txt | tail -1)"
done
(cd scripts && AB_REPS=7 AB_FA3_VARIANTS=0,40 AB_FA3_BWD=$PWD/../_wheels/fa3bwd_run timeout 200 python3 bwd_ab.py 0 \
  128,2048 128,8192 128,4096,causal 128,16384,causal 128,4096,gqa,causal > $OUT/ab_v40.txt 2>&1)
echo "$(el) ab v40 rc=$?"; cat $OUT/ab_v40.txt
