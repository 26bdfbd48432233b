#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 240 python3 -m pytest tests/test_gpu.py -q -p no:cacheprovider -x -k "o_through_v or (test_varlen_persistent_slots_change_no_bit and 256) or (test_hopper_forward_matches_mma_sync_oracle and 256 and (persistence or d64-2wg or default or p-smem-192))" > $OUT/tests_v12.txt 2>&1
rc=$?; echo "$(el) tests rc=$rc"; tail -3 $OUT/tests_v12.txt
if [ $rc -ne 0 ]; then grep -E "Error|assert|FAILED" $OUT/tests_v12.txt | head -20; exit 1; fi
(cd scripts && AB_REPS=15 timeout 240 python3 fwd_ab.py 0,12 256,2048 256,2048,causal 256,4096 256,4096,causal 256,8192 256,8192,causal 256,16384 256,16384,causal > $OUT/ab_d256_v12.txt 2>&1; echo "$(el) ab rc=$?")
cat $OUT/ab_d256_v12.txt
timeout 150 python3 scripts/host_ab.py > $OUT/host_ab.txt 2>&1; echo "$(el) host_ab rc=$?"; cat $OUT/host_ab.txt
