#!/usr/bin/env bash
# Session 41's part 2: the whole GPU suite on the build's defaults (~75-330 s), then variant 32
# (fa3 mode, d = 256) on dense shapes and variant 23 (fa3 mode, d = 128's diagonal tiles masked by
# key-row ranges) under a causal mask, and variant 33 (each KV-outer block from its own diagonal
# tile) without a mask (8k causal: the control, no change expected), FlashAttention-3's backward
# in the same runs.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -20
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32 AB_FA3_BWD=$FA3_BWD_DIR timeout 110 python3 bwd_ab.py 0 256,2048 256,8192 256,16384 256,2048,causal 256,8192,causal > $OUT/ab_v32.txt 2>&1); echo "$(el) ab v32 rc=$?"; cat $OUT/ab_v32.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,23 AB_FA3_BWD=$FA3_BWD_DIR timeout 80 python3 bwd_ab.py 0 128,2048,causal 128,4096,causal 128,8192,causal > $OUT/ab_v23.txt 2>&1); echo "$(el) ab v23 rc=$?"; cat $OUT/ab_v23.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,33 AB_FA3_BWD=$FA3_BWD_DIR timeout 150 python3 bwd_ab.py 0 64,4096 64,16384 128,4096 128,8192 128,16384 256,4096 256,16384 128,8192,causal 128,16384,gqa > $OUT/ab_v33.txt 2>&1); echo "$(el) ab v33 rc=$?"; cat $OUT/ab_v33.txt
