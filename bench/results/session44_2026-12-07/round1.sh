#!/usr/bin/env bash
# Session 44, on the build of 6186bd3 (or later: _wheels/commit.txt), which adds backward variant
# 39 (fa3 mode, d = 128: 80 x 128 tiles, dQ transposed, dq_accum in 80-row tiles) and carries
# session 43's unmeasured changes (the d = 256 forward without local memory, 16-byte stores).
# PART=a (~7 min): the whole GPU suite (variant 39 among test_hopper_kv_backward's forms and the
# GQA work orders', dense and varlen), compute-sanitizer memcheck / racecheck on variant 39
# (GQA, causal, windowed, odd lengths), then variant 39 against the default and FlashAttention-3's
# backward, interleaved (prediction: -3 to +3% without a mask at 2k-16k; its unmasked loop is
# 548 SASS instructions per 80 rows, 6.9 a row against the default's 7.3; and it waits for dK at
# each tile's end, which the default does not). PART=b (~5 min): session 43's round (forward
# sanitizers, tile-counter cases, varlen memcheck, forward / backward A/B against 8c8566d).
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run (PART=a), _wheels/_C_base.so.xz
# (PART=b).
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"
PART=${PART:-a}
# (PART=c: PART=a with variant 39's tests alone, for a short device budget)
SEL=()
[ $PART = c ] && SEL=(-k "kv-80rows or rows80")
if [ $PART = a ] || [ $PART = c ]; then
  (cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
  timeout 300 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider "${SEL[@]}" > $OUT/gpu_suite.txt 2>&1
  echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -12
  for tool in memcheck racecheck; do
    SANITIZE_ONLY_GQA_ORDERS=1 SANITIZE_VARIANTS=39 timeout 80 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_v39_$tool.txt 2>&1
    echo "$(el) v39 $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_v39_$tool.txt | tail -1)"
  done
  (cd scripts && AB_REPS=7 AB_FA3_VARIANTS=0,39 AB_FA3_BWD=$PWD/../_wheels/fa3bwd_run timeout 150 python3 bwd_ab.py 0 128,2048 128,8192 128,16384 128,4096,causal 128,4096,gqa > $OUT/ab_v39.txt 2>&1); echo "$(el) ab v39 rc=$?"; cat $OUT/ab_v39.txt
else
  xz -dc _wheels/_C_base.so.xz > /tmp/base_C.so || exit 1
  for tool in memcheck racecheck synccheck; do
    SANITIZE_ONLY_FWD=1 timeout 120 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_fwd_$tool.txt 2>&1
    echo "$(el) fwd $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_fwd_$tool.txt | tail -1)"
  done
  SANITIZE_ONLY_TILES=1 timeout 100 compute-sanitizer --tool memcheck --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_tiles_memcheck.txt 2>&1
  echo "$(el) tiles memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/sanitize_tiles_memcheck.txt | tail -1)"
  (AB_LIB=/tmp/base_C.so AB_REPS=11 timeout 120 python3 scripts/fwd_ab.py 0 256,2048 256,8192 256,2048,causal 256,8192,causal 128,4096 64,8192 > $OUT/ab_fwd.txt 2>&1); echo "$(el) ab fwd rc=$?"; cat $OUT/ab_fwd.txt
  (cd scripts && AB_LIB=/tmp/base_C.so AB_REPS=9 timeout 100 python3 bwd_ab.py 0 64,1024 128,1024 128,2048 256,2048 > $OUT/ab_bwd.txt 2>&1); echo "$(el) ab bwd rc=$?"; cat $OUT/ab_bwd.txt
fi
