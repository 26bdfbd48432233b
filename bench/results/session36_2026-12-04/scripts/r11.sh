#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 100 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "programmatic_launch or o_through_v" > $OUT/tests_pdl.txt 2>&1
echo "$(el) tests rc=$?"; tail -2 $OUT/tests_pdl.txt
(cd scripts && AB_ENV=GPROJ_FWD_AB AB_REPS=15 timeout 120 python3 fwd_ab.py 0,4096 256,1024 256,2048 256,2048,causal 256,4096 256,4096,causal 256,8192,causal 256,16384 > $OUT/ab_d256_pdl.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d256_pdl.txt
(cd scripts && AB_REPS=21 timeout 90 python3 fwd_ab.py 0,8 128,16384,causal 128,16384,causal,gqa 128,12288,causal > $OUT/ab_d128_16k_causal_v8.txt 2>&1; echo "$(el) ab128 rc=$?")
cat $OUT/ab_d128_16k_causal_v8.txt
