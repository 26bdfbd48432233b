#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 150 python3 scripts/energy_probe.py 128,2048 128,8192 128,4096,causal 64,4096,causal 64,8192 256,4096,causal 2>&1 | tee $OUT/energy_probe.txt
echo "$(el) energy"
MODES="upstream fa3" KERNS=fwd_sm90_kernel D=128 timeout 300 bash scripts/ncu_round.sh 2048 2>&1 | tail -40
echo "$(el) ncu"
rm -f $OUT/*.ncu-rep $OUT/*.sass.csv $OUT/*.log
ls $OUT
