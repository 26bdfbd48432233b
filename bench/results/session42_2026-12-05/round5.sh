#!/usr/bin/env bash
# Session 42 round 5: Nsight Compute on fa3 mode's d = 64 KV-outer pass and FlashAttention-3's
# backward at N = 8k under a causal mask (the widest d = 64 gap: 15% in session 39's A/B, 0.89 of
# FlashAttention-3's ratio in speed.json), one steady-state launch each. Session 40's round had
# the FlashAttention-3 files dropped by the device's file limit: only the stall regions, the
# details' key lines and FlashAttention-3's per-instruction samples are kept here.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
echo "build: $(cat _wheels/commit.txt)"
CAUSAL=causal MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=64 bash scripts/ncu_round.sh 8192 2>&1 | tail -30
cd $OUT && for f in *.txt; do case $f in *regions.txt) ;; *) grep -E "Duration|Throughput|Ipc|Issue Slots|Eligible|Warp Cycles|Stall|stall|Conflicts|Registers|Active Warps|Theoretical Occ|Achieved Occ|Executed Instructions  " $f > ${f%.txt}.key ;; esac; done
for f in *.regions.txt; do echo "== $f"; cat $f; done > regions_all.txt
for f in *.key; do echo "== $f"; cat $f; done > details_all.txt
mkdir -p keep && mv regions_all.txt details_all.txt keep/ && (mv ncu_upstream_bwd_*.sass.csv keep/ 2>/dev/null; true) && rm -f ./*.* && mv keep/* . && rmdir keep
xz -9 ncu_upstream_bwd_*.sass.csv 2>/dev/null; ls -la; cat regions_all.txt; head -c 4000 details_all.txt
