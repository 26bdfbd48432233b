#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 150 python3 scripts/host_profile.py > $OUT/host_profile.txt 2>&1
echo "$(el) host_profile rc=$?"
timeout 120 python3 scripts/host_cost.py > $OUT/host_cost.txt 2>&1
echo "$(el) host_cost rc=$?"; head -4 $OUT/host_cost.txt
S=""
for d in 64 128 256; do for n in 2048 4096 8192 16384; do S="$S $d,$n $d,$n,causal"; done; done
S="$S 128,4096,gqa 128,4096,causal,gqa 128,16384,gqa 128,16384,causal,gqa"
(cd scripts && AB_REPS=15 timeout 330 python3 fwd_ab.py 0 $S > $OUT/fwd_ab_all.txt 2>&1; echo "$(el) fwd_ab rc=$?")
sed -n '/== summary/,$p' $OUT/host_profile.txt
tail -80 $OUT/fwd_ab_all.txt
