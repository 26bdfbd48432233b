#!/usr/bin/env bash
# Session 45, one short call (~4 device minutes): (1) the backward back to back under the power cap
# at d = 128 (cuDNN, fa3 mode v0 / v39, gproj, FlashAttention-3's
# backward; ms, mJ per call, W, MHz); (2) Nsight Compute on fa3 mode's KV-outer pass and
# FlashAttention-3's backward kernel at d = 128 N = 8k causal (ncu_round.sh's first case).
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run.
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"; nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export AB_FA3_BWD=$PWD/_wheels/fa3bwd_run FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
(cd scripts && timeout 150 python3 energy_probe.py --bwd 0,39 128,2048 128,8192 128,4096,causal \
  > $OUT/energy_bwd_d128.txt 2>&1; echo "rc=$?" >> $OUT/energy_bwd_d128.txt)
echo "$(el) energy"; cat $OUT/energy_bwd_d128.txt
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
TOP=$OUT; export OUT=$TOP/d128_causal; mkdir -p $OUT
CAUSAL=causal GPROJ_BWD_VARIANT=0 MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=128 \
  timeout 330 bash scripts/ncu_round.sh 8192 2>&1 | tail -12
(cd $OUT && for f in *.txt; do case $f in *regions.txt) ;; *) grep -E "Duration|Throughput|Ipc|Issue Slots|Eligible|Warp Cycles|Stall|stall|Conflicts|Registers|Active Warps|Theoretical Occ|Achieved Occ|Executed Instructions  |DRAM|L2 Hit|Elapsed Cycles|SM Frequency" $f > ${f%.txt}.key ;; esac; done
 for f in *.regions.txt; do echo "== $f"; cat $f; done > regions_all.txt
 for f in *.key; do echo "== $f"; cat $f; done > details_all.txt
 rm -f ./*.ncu-rep; xz -9 ./*.sass.csv 2>/dev/null; ls -la; cat details_all.txt | head -80; head -70 regions_all.txt)
echo "$(el) done"
