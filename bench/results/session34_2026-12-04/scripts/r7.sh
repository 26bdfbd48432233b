#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 80 python3 scripts/energy_probe.py --modes fa3 --env GPROJ_FWD_AB=-,16 128,4096,causal 64,4096,causal 128,8192,causal 64,16384,causal 2>&1 | tee $OUT/energy_causal_group.txt
echo "$(el)"
timeout 60 python3 scripts/energy_probe.py --modes fa3 --env GPROJ_TILE_ORDER=-,2 256,4096,causal 256,16384,causal 128,16384,causal 2>&1 | tee $OUT/energy_causal_onetile.txt
echo "$(el)"
timeout 40 python3 scripts/energy_probe.py --modes gproj --no-fa3 --env GPROJ_FWD_AB=-,1024 128,8192 64,16384 2>&1 | tee $OUT/energy_gproj_pairs.txt
echo "$(el)"
MODES="upstream fa3" KERNS=fwd_sm90_kernel D=128 CAUSAL=causal timeout 150 bash scripts/ncu_round.sh 4096 2>&1 | grep -E "ncu|Duration|Memory Throughput|Issue"
rm -f $OUT/*.ncu-rep $OUT/*.sass.csv $OUT/*.log
echo "$(el) done"
