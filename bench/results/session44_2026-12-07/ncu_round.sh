#!/usr/bin/env bash
# Session 44: Nsight Compute on fa3 mode's KV-outer pass and FlashAttention-3's backward, one
# steady-state launch each, N = 8k causal, at d = 128 (the same 64 x 128 tiles and, since session
# 37, about the same SASS per tile: ours 468 on the unmasked path, its 486 with its inline mask;
# yet 5-8% behind its ratio to cuDNN in speed.json) and d = 64 (session 42's round5). Carry:
# _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run (libfa3bwd.so.xz + fa3bwd.py) and this
# script. ~4 device minutes. Only the stall regions, the details' key lines and the per-instruction
# sample files (xz) come back.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
echo "build: $(cat _wheels/commit.txt)"
for d in ${DS:-128 64}; do
  CAUSAL=causal MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=$d bash scripts/ncu_round.sh 8192 2>&1 | tail -30
done
cd $OUT && for f in *.txt; do case $f in *regions.txt) ;; *) grep -E "Duration|Throughput|Ipc|Issue Slots|Eligible|Warp Cycles|Stall|stall|Conflicts|Registers|Active Warps|Theoretical Occ|Achieved Occ|Executed Instructions  " $f > ${f%.txt}.key ;; esac; done
for f in *.regions.txt; do echo "== $f"; cat $f; done > regions_all.txt
for f in *.key; do echo "== $f"; cat $f; done > details_all.txt
mkdir -p keep && mv regions_all.txt details_all.txt keep/ && (mv ./*.sass.csv keep/ 2>/dev/null; true) && rm -f ./*.* && mv keep/* . && rmdir keep
xz -9 ./*.sass.csv 2>/dev/null; ls -la; cat regions_all.txt | head -150; head -c 5000 details_all.txt
