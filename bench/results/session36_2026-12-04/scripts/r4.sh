#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 240 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -x -k "o_through_v or (test_varlen_persistent_slots_change_no_bit and 256) or (test_hopper_forward_matches_mma_sync_oracle and 256 and (persistence or p-smem or default))" > $OUT/tests_v7.txt 2>&1
rc=$?; echo "$(el) tests rc=$rc"; tail -3 $OUT/tests_v7.txt
if [ $rc -ne 0 ]; then grep -E "Error|assert|FAILED" $OUT/tests_v7.txt | head -20; exit 1; fi
(cd scripts && AB_REPS=15 timeout 240 python3 fwd_ab.py 0,7,12 256,2048 256,2048,causal 256,4096 256,4096,causal 256,8192 256,8192,causal 256,16384 256,16384,causal > $OUT/ab_d256_v7_v12.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d256_v7_v12.txt
timeout 150 python3 scripts/host_profile_bwd.py > $OUT/host_profile_bwd.txt 2>&1; echo "$(el) host_bwd rc=$?"; head -4 $OUT/host_profile_bwd.txt
