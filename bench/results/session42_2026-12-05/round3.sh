#!/usr/bin/env bash
# Sessions 41-42, part 3: d = 256 GQA (gproj's split group in 1 / 2 / 4 / 8 shares: 0sS; fa3 mode
# variants 0, 32, 36), variant 23 (fa3 mode, d = 128's diagonal tiles masked by key-row ranges)
# under a causal mask, variant 33 (each KV-outer block from its own diagonal tile) without a
# mask (8k causal: the control, no change expected) and variant 37 (d = 64 / 128: every consumer
# warp copies a share of the row state), FlashAttention-3's backward in the same runs.
source scripts/device_prelude.sh
(cd _wheels/fa3bwd_run && xz -dc libfa3bwd.so.xz > libfa3bwd.so) || exit 1
export FA3_BWD_DIR=$PWD/_wheels/fa3bwd_run
echo "build: $(cat _wheels/commit.txt)"
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,32,36 AB_FA3_BWD=$FA3_BWD_DIR timeout 200 python3 bwd_ab.py 0,0s2,0s4,0s8 256,4096,gqa 256,16384,gqa 256,4096,causal,gqa 256,16384,causal,gqa > $OUT/ab_gqa.txt 2>&1); echo "$(el) ab gqa rc=$?"; cat $OUT/ab_gqa.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,23 AB_FA3_BWD=$FA3_BWD_DIR timeout 80 python3 bwd_ab.py 0 128,2048,causal 128,4096,causal 128,8192,causal > $OUT/ab_v23.txt 2>&1); echo "$(el) ab v23 rc=$?"; cat $OUT/ab_v23.txt
(cd scripts && AB_REPS=9 AB_FA3_VARIANTS=0,33,37 AB_FA3_BWD=$FA3_BWD_DIR timeout 240 python3 bwd_ab.py 0 64,4096 64,16384 128,4096 128,8192 128,16384 256,4096 256,16384 64,2048,causal 64,8192,causal 128,8192,causal 128,16384,gqa > $OUT/ab_v33.txt 2>&1); echo "$(el) ab v33 rc=$?"; cat $OUT/ab_v33.txt
