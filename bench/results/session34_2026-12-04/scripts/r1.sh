#!/usr/bin/env bash
# Session 34 round 1: the aligned shift's A/B, the new test, the GPU suite.
source scripts/device_prelude.sh
python3 -c "import gproj_cuda as g; print('available:', g.is_available(), g.unavailable_reason())"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 90 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "query_tile_shift or schedules_change_no_bit or o_by_tma" 2>&1 | tail -5 | tee $OUT/tests_new.txt
echo "$(el) new tests"
( cd scripts && AB_ENV=GPROJ_FWD_AB AB_REPS=11 timeout 200 python3 fwd_ab.py 0,256 64,v2048,causal 128,v2048,causal 128,v4096,causal 64,v4096,causal 256,v2048,causal 64,4096,causal ) > $OUT/ab_varlen_align.txt 2>&1
echo "$(el) ab rc=$?"; tail -40 $OUT/ab_varlen_align.txt
timeout 280 python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu -q -p no:cacheprovider -x 2>&1 | tail -8 > $OUT/gpu_suite.txt
echo "$(el) suite"; cat $OUT/gpu_suite.txt
