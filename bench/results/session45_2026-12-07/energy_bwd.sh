#!/usr/bin/env bash
# Session 45: the backward in the power-capped regime (session 34 item 3: a sustained run sits at
# the 700 W cap, so the clock follows the energy per call). Back to back for 2 s per candidate
# (scripts/energy_probe.py --bwd): cuDNN, fa3 mode (variants 0 and 39 at d = 128), gproj, and
# FlashAttention-3's backward. Question: is fa3 mode's 5-8% gap to FlashAttention-3 at d = 128
# cycles (the same under ncu's locked clock) or energy (a lower clock at the cap)?
# Then (RUN_AB=1) ab_v39.sh's interleaved A/B. ~2 + 3 device minutes.
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run.
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"; nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export AB_FA3_BWD=$PWD/_wheels/fa3bwd_run
(cd scripts && timeout 200 python3 energy_probe.py --bwd 0,39 ${ECASES:-128,2048 128,8192 128,4096,causal} \
  > $OUT/energy_bwd_d128.txt 2>&1; echo "rc=$?" >> $OUT/energy_bwd_d128.txt)
(cd scripts && timeout 100 python3 energy_probe.py --bwd 0 ${ECASES64:-64,8192,causal 64,4096} \
  > $OUT/energy_bwd_d64.txt 2>&1; echo "rc=$?" >> $OUT/energy_bwd_d64.txt)
echo "$(el) energy"; cat $OUT/energy_bwd_d128.txt $OUT/energy_bwd_d64.txt
if [ "${RUN_AB:-0}" = 1 ]; then
  (cd scripts && AB_REPS=7 AB_FA3_VARIANTS=0,39 timeout 250 python3 bwd_ab.py 0 128,2048 128,8192 \
    128,16384 128,16384,gqa > $OUT/ab_v39.txt 2>&1); echo "$(el) ab v39 rc=$?"; cat $OUT/ab_v39.txt
fi
