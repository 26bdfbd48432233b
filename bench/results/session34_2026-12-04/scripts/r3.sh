#!/usr/bin/env bash
set -uo pipefail
export PYTHONUNBUFFERED=1
xz -dc _wheels/_C.so.xz > gproj_cuda/_C.cpython-312-x86_64-linux-gnu.so || exit 1
( cd _wheels/fa3/flash_attn_3 && xz -dc _C.abi3.so.xz > _C.abi3.so ) || exit 1
export PYTHONPATH=$PWD:$PWD/_wheels/fa3
timeout 300 python3 scripts/fwd_paths.py 64,4096,causal 64,2048,causal 128,2048 128,1024,causal 256,1024 2>&1 | tee $OUT/fwd_paths.txt
