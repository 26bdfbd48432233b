#!/usr/bin/env bash
# Session 43's forward changes on the GPU (prepared in session 43, which had no device time; run
# by the next session that has): the d = 256 forward without local memory, 16-byte global stores
# (bench/NOTES.md session 43; the build's commit in _wheels/commit.txt). Carry: _wheels/_C.so.xz
# (the new build), _wheels/_C_base.so.xz (8c8566d's, the build before), _wheels/fa3
# (FlashAttention-3's forward wheel, scripts/fa3_side.sh; optional) and this script. Device
# time: ~10-12 minutes (suite ~4, sanitizers ~3-4, A/Bs ~3.5).
source scripts/device_prelude.sh
xz -dc _wheels/_C_base.so.xz > /tmp/base_C.so || exit 1
# PART=a: steps 1-2 (forward sanitizers); PART=b: the rest (one device call is at most 10 minutes)
PART=${PART:-all}
if [ $PART != b ]; then
# 1. The whole GPU suite on the new build: the forward's oracle tests (every variant, both
#    numerics, masks), the O store by threads against TMA (GPROJ_FWD_AB=2: o_row_addr), key
#    offsets (q . shift: q_chunk_addr), varlen slots (tiles without keys: o_free's phases).
timeout 420 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -x > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -8
# 2. compute-sanitizer on the forward variants and the varlen grids (small shapes)
for tool in memcheck racecheck synccheck; do
  SANITIZE_ONLY_FWD=1 timeout 150 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_fwd_$tool.txt 2>&1
  echo "$(el) fwd $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_fwd_$tool.txt | tail -1)"
done
fi
if [ $PART != a ]; then
# (the persistent kernels' tile counter, d = 256's default over fewer keys than queries: tiles
# without keys, o_free's phases)
for tool in memcheck racecheck; do
  SANITIZE_ONLY_TILES=1 timeout 150 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_tiles_$tool.txt 2>&1
  echo "$(el) tiles $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_tiles_$tool.txt | tail -1)"
done
SANITIZE_ONLY_VARLEN=1 timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_varlen_memcheck.txt 2>&1
echo "$(el) varlen memcheck rc=$? $(grep -E 'ERROR SUMMARY' $OUT/sanitize_varlen_memcheck.txt | tail -1)"
# 3. Interleaved against the build before (AB_LIB), FlashAttention-3's forward beside: prediction
#    0 +- 1% everywhere (the changed instructions are outside the key loop; d = 256 loses ~20
#    local loads per query tile)
(AB_LIB=/tmp/base_C.so AB_REPS=15 timeout 200 python3 scripts/fwd_ab.py 0 256,2048 256,8192 256,2048,causal 256,8192,causal 128,4096 128,4096,causal 64,8192 64,8192,causal 256,v1024 > $OUT/ab_fwd.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_fwd.txt
# 4. The backward against the build before: the dK / dV epilogues' 16-byte stores (prediction:
#    <= 0.5% at N <= 2k, nothing beyond)
(cd scripts && AB_LIB=/tmp/base_C.so AB_REPS=11 timeout 150 python3 bwd_ab.py 0 64,1024 64,2048,causal 128,1024 128,2048 256,2048 128,8192 > $OUT/ab_bwd.txt 2>&1); echo "$(el) ab bwd rc=$?"; cat $OUT/ab_bwd.txt
fi
