#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 200 python3 _wheels/rounds_probe.py > $OUT/rounds_probe.txt 2>&1; echo "$(el) rc=$?"; grep gproj $OUT/rounds_probe.txt; tail -3 $OUT/rounds_probe.txt
