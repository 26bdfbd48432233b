#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 120 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -k "schedules_change_no_bit or query_tile_shift or persistent" 2>&1 | tail -3 | tee $OUT/tests_sched.txt
echo "$(el) tests"
( cd scripts && AB_ENV=GPROJ_FWD_AB AB_REPS=11 timeout 200 python3 fwd_ab.py 0,1024 64,2048 64,8192 64,16384 128,2048 128,4096 128,8192 128,16384 128,4096,gqa 128,16384,gqa ) > $OUT/ab_pair_order.txt 2>&1
echo "$(el) ab rc=$?"; cat $OUT/ab_pair_order.txt | tail -12
timeout 60 python3 scripts/energy_probe.py 128,2048 64,8192 2>&1 | tee $OUT/energy_new.txt
GPROJ_FWD_AB=1024 timeout 60 python3 scripts/energy_probe.py 128,2048 64,8192 2>&1 | tee $OUT/energy_old.txt
echo "$(el) energy"
MODES="fa3" KERNS=fwd_sm90_kernel D=128 timeout 100 bash scripts/ncu_round.sh 2048 2>&1 | tail -12
rm -f $OUT/*.ncu-rep $OUT/*.sass.csv $OUT/*.log
echo "$(el) done"
