#!/usr/bin/env bash
# Session 44 (prepared, not run): Nsight Compute on fa3 mode's KV-outer pass and FlashAttention-3's
# backward, one steady-state launch each:
#   d = 128 N = 8k causal: the same 64 x 128 tiles and about the same SASS per tile (ours 468 on
#     the unmasked path, its 486 with its inline mask), yet 5-8% behind its ratio to cuDNN;
#   d = 128 N = 16k without a mask, our variant 39 (80 x 128, dQ transposed) against its 80-row
#     kernel: 9.08 against 8.61 ms on the H100 (session 44);
#   d = 64 N = 8k causal (session 42's round5).
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run (libfa3bwd.so.xz + fa3bwd.py)
# and this script. ~6 device minutes. Only the stall regions, the details' key lines and the
# per-instruction sample files (xz) come back, one folder per case.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
echo "build: $(cat _wheels/commit.txt)"
TOP=$OUT
# case: name D N causal(0/1) variant
for c in "d128_causal 128 8192 1 0" "d128_v39 128 16384 0 39" "d64_causal 64 8192 1 0"; do
  set -- $c
  export OUT=$TOP/$1; mkdir -p $OUT
  CAUSAL=$([ $4 = 1 ] && echo causal) GPROJ_BWD_VARIANT=$5 MODES="upstream_bwd fa3" \
    KERNS=bwd_kv_sm90 D=$2 bash scripts/ncu_round.sh $3 2>&1 | tail -12
  (cd $OUT && for f in *.txt; do case $f in *regions.txt) ;; *) grep -E "Duration|Throughput|Ipc|Issue Slots|Eligible|Warp Cycles|Stall|stall|Conflicts|Registers|Active Warps|Theoretical Occ|Achieved Occ|Executed Instructions  " $f > ${f%.txt}.key ;; esac; done
   for f in *.regions.txt; do echo "== $f"; cat $f; done > regions_all.txt
   for f in *.key; do echo "== $f"; cat $f; done > details_all.txt
   mkdir -p keep && mv regions_all.txt details_all.txt keep/ && (mv ./*.sass.csv keep/ 2>/dev/null; true) && rm -f ./*.* && mv keep/* . && rmdir keep
   xz -9 ./*.sass.csv 2>/dev/null; ls -la; head -60 regions_all.txt; head -c 3000 details_all.txt)
done
