#!/usr/bin/env bash
# Session 45: backward variant 39 (fa3 mode, d = 128, 80 x 128 tiles, dQ transposed) against the
# default (64 x 128) and FlashAttention-3's backward, interleaved, on whatever card is lent (the
# reply names it). Prediction (from the H100 run of session 44): -1 to +1% at 2k-8k, -2 to -3% at
# 16k, without a mask. ~3 device minutes.
# Carry: _wheels/_C.so.xz, _wheels/commit.txt, _wheels/fa3bwd_run.
source scripts/device_prelude.sh
echo "build: $(cat _wheels/commit.txt)"; nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
(cd scripts && AB_REPS=${AB_REPS:-7} AB_FA3_VARIANTS=0,39 AB_FA3_BWD=$PWD/../_wheels/fa3bwd_run timeout 400 \
  python3 bwd_ab.py 0 ${CASES:-128,2048 128,4096 128,8192 128,16384 128,4096,gqa 128,16384,gqa} > $OUT/ab_v39.txt 2>&1)
echo "$(el) ab v39 rc=$?"; cat $OUT/ab_v39.txt
