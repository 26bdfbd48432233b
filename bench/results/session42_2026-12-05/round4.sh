#!/usr/bin/env bash
# Session 42, part 4: d = 64's passes kernel by kernel, dense against GQA (the same tiles; GQA's
# KV-outer blocks walk 8 heads each: 8x fewer blocks), to size the per-block cost (session 42's
# question: fa3 mode trails FlashAttention-3 by ~9% dense but ~1.5% GQA at d = 64 in session
# 39's A/B); and d = 64 causal GQA at 8k / 16k (speed.json: 0.88 of FlashAttention-3's ratio at
# 16k) in 2 / 4 shares and tile-major.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
(cd scripts && KERNELS=1 AB_REPS=5 AB_FA3_BWD=$FA3_BWD_DIR timeout 120 python3 bwd_ab.py 0 64,4096 64,4096,gqa 64,8192,causal 64,8192,causal,gqa > $OUT/kernels_d64.txt 2>&1); echo "$(el) kernels d64 rc=$?"; cat $OUT/kernels_d64.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,0s2,0s4,20 AB_FA3_BWD=$FA3_BWD_DIR timeout 100 python3 bwd_ab.py 0 64,8192,causal,gqa 64,16384,causal,gqa > $OUT/ab_d64_gqa.txt 2>&1); echo "$(el) ab d64 gqa rc=$?"; cat $OUT/ab_d64_gqa.txt
