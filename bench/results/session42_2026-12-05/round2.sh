#!/usr/bin/env bash
# Sessions 41-42, part 2: the whole GPU suite on the build's defaults (~75-330 s), then fa3 mode's
# d = 256 forms on dense shapes: variant 32 (FlashAttention-3's GEMM order), 34 (cut tiles masked
# by key ranges per query row), 36 (34 with per-block address parts formed once), 35 (32 + 36),
# FlashAttention-3's backward in the same run.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
timeout 200 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -2 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head -20
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32,34,35,36 AB_FA3_BWD=$FA3_BWD_DIR timeout 230 python3 bwd_ab.py 0 256,2048 256,8192 256,16384 256,2048,causal 256,4096,causal 256,8192,causal > $OUT/ab_v32.txt 2>&1); echo "$(el) ab v32 rc=$?"; cat $OUT/ab_v32.txt
