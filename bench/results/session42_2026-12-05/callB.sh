#!/usr/bin/env bash
# Session 42, as run (call B): d = 256 GQA (gproj's split group; fa3 mode 0 / 32 / 36), variants
# 33 and 37 (round3.sh's), then compute-sanitizer memcheck on the GQA / new forms (round1.sh's).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32,36 AB_FA3_BWD=$FA3_BWD_DIR timeout 200 python3 bwd_ab.py 0,0s2,0s4,0s8 256,4096,gqa 256,16384,gqa 256,4096,causal,gqa 256,16384,causal,gqa > $OUT/ab_gqa.txt 2>&1); echo "$(el) ab gqa rc=$?"; cat $OUT/ab_gqa.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,33,37,23 AB_FA3_BWD=$FA3_BWD_DIR timeout 240 python3 bwd_ab.py 0 64,4096 64,16384 128,4096 128,8192 128,16384 256,4096 256,16384 64,2048,causal 64,8192,causal 128,8192,causal 128,16384,gqa > $OUT/ab_v33.txt 2>&1); echo "$(el) ab v33 rc=$?"; cat $OUT/ab_v33.txt
for tool in memcheck; do
  SANITIZE_VARIANTS=32,33,34,36,37,33s2,g0s2,g0s4,g6s4 SANITIZE_ONLY_GQA_ORDERS=1 timeout 120 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > $OUT/sanitize_$tool.txt 2>&1
  echo "$(el) $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize_$tool.txt | tail -1)"
done
