#!/usr/bin/env bash
source scripts/device_prelude.sh
cd scripts
timeout 150 python3 fwd_timeline.py 128,v1024 128,v1024,causal 128,v4096,causal 128,2048 > $OUT/timeline_varlen.txt 2>&1
echo "$(el) timeline rc=$?"; grep -v "^\s*$" $OUT/timeline_varlen.txt | head -80
AB_REPS=15 timeout 200 python3 fwd_ab.py 0,9 128,v1024 128,v1024,causal 128,v4096 128,v4096,causal > $OUT/ab_varlen_v9.txt 2>&1
echo "$(el) ab rc=$?"; tail -8 $OUT/ab_varlen_v9.txt
