#!/usr/bin/env bash
source scripts/device_prelude.sh
(cd scripts && AB_REPS=15 timeout 100 python3 fwd_ab.py 0,6,7,4 64,4096 64,8192 64,16384 > $OUT/ab_d64_long.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d64_long.txt
timeout 100 python3 scripts/host_profile_bwd.py > $OUT/host_profile_bwd.txt 2>&1; echo "$(el) host_bwd rc=$?"; grep "us/call" $OUT/host_profile_bwd.txt
