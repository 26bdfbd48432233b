#!/usr/bin/env bash
# Session 39: where d = 64's and d = 256's gaps to FlashAttention-3's backward are (ncu, one
# steady-state launch each, N = 8k without a mask): ours (d = 64 with variant 27's form) and its.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
export PYTHONPATH=$PYTHONPATH:$PWD/scripts
GPROJ_BWD_VARIANT=27 MODES="upstream_bwd fa3" KERNS=bwd_kv_sm90 D=64 bash scripts/ncu_round.sh 8192 2>&1 | tail -40
MODES="upstream_bwd fa3" KERNS=bwd_kv_dkvt D=256 bash scripts/ncu_round.sh 8192 2>&1 | tail -40
