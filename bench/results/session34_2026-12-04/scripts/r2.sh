#!/usr/bin/env bash
source scripts/device_prelude.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 _wheels/memcheck_shift.py > $OUT/memcheck_shift.txt 2>&1
echo "$(el) memcheck rc=$?"; tail -3 $OUT/memcheck_shift.txt
C=$(cat _wheels/commit.txt)
GPROJ_COMMIT=$C timeout 420 python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,sdpa_flash,fa3 --budget-s 0.2 --pause 0.05 --rounds 3 --out $OUT/speed.json --md $OUT/speed.md --plot $OUT/speed.png > $OUT/speed_log.txt 2>&1
echo "$(el) speed rc=$?"; tail -5 $OUT/speed_log.txt
