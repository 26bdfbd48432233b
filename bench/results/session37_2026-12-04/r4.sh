#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
OUT=$OUT MODES="upstream_bwd" KERNS=bwd_kv_sm90 D=128 CAUSAL=causal timeout 200 bash scripts/ncu_round.sh 8192
for f in $OUT/*.regions.txt; do echo "== $f"; head -45 $f; done
(cd scripts && AB_REPS=7 AB_FA3_VARIANTS=0,11,20 AB_FA3_BWD=$FA3_BWD_DIR timeout 150 python3 bwd_ab.py 0 128,16384 128,16384,causal 128,4096 > $OUT/ab_pdl.txt 2>&1); echo "$(el) ab rc=$?"; cat $OUT/ab_pdl.txt
