#!/usr/bin/env bash
# Session 42, as run (call D): call C's one failure again with the test fixed (fa3 mode's d = 256
# GQA dK / dV are summed in varying order, session 40's default: the test asked them bitwise),
# then speed.py at one head dim (D=256 by default) on the new defaults, FlashAttention-3's
# forward and backward in the same run (as session 40's r2.sh / r3.sh).
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
D=${D:-256}
timeout 60 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "predecessor_tail and 256" > $OUT/tests_tail.txt 2>&1; echo "$(el) tests rc=$?"; tail -1 $OUT/tests_tail.txt; grep -E "^FAILED" $OUT/tests_tail.txt | head
echo "build: $(cat _wheels/commit.txt); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
GPROJ_COMMIT=$(cat _wheels/commit.txt) timeout ${LIMIT:-540} python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --hdims $D --budget-s 0.2 --pause 0.05 --rounds 3 --warm-s 0.3 --out $OUT/speed_d$D.json > $OUT/speed_d$D.log 2>&1
echo "$(el) speed d=$D rc=$?"; grep -E "^\| $D \|" $OUT/speed_d$D.log | grep -v varlen | head -40
