#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
xz -dc _wheels/_C.so.xz > gproj_cuda/_C.cpython-312-x86_64-linux-gnu.so || exit 1
( cd _wheels/fa3/flash_attn_3 && xz -dc _C.abi3.so.xz > _C.abi3.so ) || exit 1
export PYTHONPATH=$PWD:$PWD/_wheels/fa3
timeout 150 python3 scripts/energy_probe.py 128,2048 128,8192 128,4096,causal 64,4096,causal 64,8192 256,4096,causal 2>&1 | tee $OUT/energy_probe.txt
echo "$(el) energy"
MODES="upstream fa3" KERNS=fwd_sm90_kernel D=128 timeout 300 bash scripts/ncu_round.sh 2048 2>&1 | tail -40
echo "$(el) ncu"
for f in $OUT/ncu_*.txt; do cp $f $OUT/; done
rm -f $OUT/*.ncu-rep $OUT/*.sass.csv $OUT/*.log
ls $OUT
