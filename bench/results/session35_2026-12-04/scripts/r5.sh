#!/usr/bin/env bash
source scripts/device_prelude.sh
cd scripts
AB_REPS=15 timeout 150 python3 fwd_ab.py 0,6 256,v1024 256,v1024,causal 256,v4096 256,v4096,causal > $OUT/ab_varlen256_v06.txt 2>&1; echo "$(el) rc=$?"; tail -5 $OUT/ab_varlen256_v06.txt
