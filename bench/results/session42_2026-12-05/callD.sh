#!/usr/bin/env bash
# Session 42, as run (call D): speed.py at one head dim (D=256 by default) on the new defaults,
# FlashAttention-3's forward and backward in the same run (as session 40's r2.sh / r3.sh).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
D=${D:-256}
echo "build: $(cat _wheels/commit.txt); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
GPROJ_COMMIT=$(cat _wheels/commit.txt) timeout ${LIMIT:-540} python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --hdims $D --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --out $OUT/speed_d$D.json > $OUT/speed_d$D.log 2>&1
echo "$(el) speed d=$D rc=$?"; grep -E "^\| $D \|" $OUT/speed_d$D.log | grep -v varlen | head -40
