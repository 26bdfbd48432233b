#!/usr/bin/env bash
# Session 40 round 4: ncu of fa3 mode's KV-outer pass and FlashAttention-3's backward, one
# steady-state launch each, N = 8k: d = 64 without a mask and causal, d = 256 without a mask.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=64 bash scripts/ncu_round.sh 8192 2>&1 | tail -40
CAUSAL=causal MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=64 bash scripts/ncu_round.sh 8192 2>&1 | tail -40
MODES="upstream_bwd fa3" KERNS=bwd_kv_dkvt D=256 bash scripts/ncu_round.sh 8192 2>&1 | tail -40
