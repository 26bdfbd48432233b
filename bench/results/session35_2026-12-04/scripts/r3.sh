#!/usr/bin/env bash
source scripts/device_prelude.sh
cd scripts
AB_REPS=15 timeout 200 python3 fwd_ab.py 0,8,4 128,v1024 128,v1024,causal 128,v4096 128,v4096,causal > $OUT/ab_varlen_persist.txt 2>&1
echo "$(el) ab rc=$?"; tail -8 $OUT/ab_varlen_persist.txt
