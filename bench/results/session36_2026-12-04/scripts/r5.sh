#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd scripts && AB_REPS=15 timeout 300 python3 fwd_ab.py 0,7 256,1024 256,1024,causal 256,512 256,512,causal 256,v1024 256,v1024,causal 256,v4096 256,v4096,causal > $OUT/ab_d256_v7_short_varlen.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d256_v7_short_varlen.txt
