#!/usr/bin/env bash
source scripts/device_prelude.sh
timeout 300 python3 scripts/fwd_paths.py 64,4096,causal 64,2048,causal 128,2048 128,1024,causal 256,1024 2>&1 | tee $OUT/fwd_paths.txt
