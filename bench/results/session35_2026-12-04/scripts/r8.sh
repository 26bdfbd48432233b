#!/usr/bin/env bash
source scripts/device_prelude.sh
cd scripts
AB_REPS=11 timeout 100 python3 fwd_ab.py 0,9,3 128,8192,causal 128,4096,causal > $OUT/ab_causal8k_128.txt 2>&1; echo "$(el) rc=$?"; tail -3 $OUT/ab_causal8k_128.txt
AB_ENV=GPROJ_FWD_AB AB_REPS=11 timeout 100 python3 fwd_ab.py 0,16 128,8192,causal 64,8192,causal 128,16384,causal,gqa > $OUT/ab_causal8k_order.txt 2>&1; echo "$(el) rc=$?"; tail -4 $OUT/ab_causal8k_order.txt
AB_REPS=11 timeout 100 python3 fwd_ab.py 0,3 256,8192,causal 256,2048 > $OUT/ab_causal8k_256.txt 2>&1; echo "$(el) rc=$?"; tail -3 $OUT/ab_causal8k_256.txt
