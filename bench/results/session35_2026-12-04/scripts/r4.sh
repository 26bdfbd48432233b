#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 240 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider -x > $OUT/suite.log 2>&1
echo "$(el) suite rc=$?"; tail -3 $OUT/suite.log; grep -E "FAILED|Error" $OUT/suite.log | head -10
cd scripts
V="128,v1024 128,v1024,causal 128,v4096 128,v4096,causal"
AB_REPS=15 timeout 150 python3 fwd_ab.py 0,3 $V > $OUT/ab_varlen128_v03.txt 2>&1; echo "$(el) rc=$?"; tail -5 $OUT/ab_varlen128_v03.txt
AB_ENV=GPROJ_FWD_AB AB_REPS=15 timeout 150 python3 fwd_ab.py 0,4,8 $V > $OUT/ab_varlen128_bits.txt 2>&1; echo "$(el) rc=$?"; tail -5 $OUT/ab_varlen128_bits.txt
AB_ENV=GPROJ_FWD_AB AB_REPS=15 timeout 150 python3 fwd_ab.py 0,4 64,v1024 64,v1024,causal 64,v4096 64,v4096,causal > $OUT/ab_varlen64_bits.txt 2>&1; echo "$(el) rc=$?"; tail -5 $OUT/ab_varlen64_bits.txt
AB_REPS=15 timeout 150 python3 fwd_ab.py 0,3 256,v1024 256,v1024,causal 256,v4096 256,v4096,causal > $OUT/ab_varlen256_v03.txt 2>&1; echo "$(el) rc=$?"; tail -5 $OUT/ab_varlen256_v03.txt
AB_REPS=15 timeout 100 python3 fwd_ab.py 0,8 128,8192 128,16384 > $OUT/ab_dense128_v9.txt 2>&1; echo "$(el) rc=$?"; tail -3 $OUT/ab_dense128_v9.txt
