#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider > $OUT/gpu_suite.txt 2>&1
echo "$(el) suite rc=$?"; tail -3 $OUT/gpu_suite.txt; grep -E "^FAILED" $OUT/gpu_suite.txt | head
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 _wheels/memcheck_d256.py > $OUT/memcheck_d256.txt 2>&1
echo "$(el) memcheck rc=$?"; tail -3 $OUT/memcheck_d256.txt
S=""
for d in 64 128 256; do for n in 2048 4096 8192 16384; do S="$S $d,$n $d,$n,causal"; done; done
S="$S 128,4096,gqa 128,4096,causal,gqa 128,16384,gqa 128,16384,causal,gqa 256,v1024 256,v1024,causal 256,v4096 256,v4096,causal"
(cd scripts && AB_REPS=15 timeout 200 python3 fwd_ab.py 0 $S > $OUT/fwd_ab_all.txt 2>&1; echo "$(el) fwd_ab rc=$?")
cat $OUT/fwd_ab_all.txt
(cd scripts && AB_REPS=15 timeout 120 python3 fwd_ab.py 0,1 128,2048,causal 128,4096,causal 128,8192,causal 128,4096,causal,gqa 128,8192 > $OUT/ab_d128_nopingpong.txt 2>&1; echo "$(el) ab128 rc=$?")
cat $OUT/ab_d128_nopingpong.txt
