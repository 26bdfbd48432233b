#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
(cd scripts && KERNELS=1 AB_REPS=5 AB_FA3_VARIANTS=0,20 AB_FA3_BWD=$FA3_BWD_DIR timeout 120 python3 bwd_ab.py 0 128,8192 128,8192,causal 128,2048 > $OUT/kernels.txt 2>&1); echo "$(el) kernels rc=$?"; cat $OUT/kernels.txt
which ncu || ls /usr/local/cuda*/bin/ncu
OUT=$OUT MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=128 CAUSAL=causal GPROJ_BWD_VARIANT=20 timeout 330 bash scripts/ncu_round.sh 8192
echo "$(el) ncu done"
for f in $OUT/*.regions.txt; do echo "== $f"; head -40 $f; done
