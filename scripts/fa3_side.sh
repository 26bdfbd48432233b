#!/usr/bin/env bash
# FlashAttention-3's own forward beside ours on the lent H200: the `tokenspeed-fa3` wheel's
# flash_attn_interface (forward only) in bench/speed.py, then Nsight Compute on one steady-state
# launch of FA3's forward kernel and of ours (fa3 and gproj modes) at the same shape.
#   OUT=... [D=128] [NCU_N=4096] [CAUSAL=] [SPEED=1] [NCU=1] [MODES="upstream fa3 gproj"] \
#     bash scripts/fa3_side.sh
# Expects the wheel unpacked under _wheels/fa3/ (flash_attn_interface.py, flash_attn_config.py,
# flash_attn_3/_C.abi3.so, or that .so as .so.xz: the carried tree is limited to 64 MiB and the
# wheel's library is 300 MB unpacked, 29 MB as xz).
source "$(dirname "$0")/../bench/_gpu_env.sh"
FA3=$PWD/_wheels/fa3
if [ ! -f "$FA3/flash_attn_3/_C.abi3.so" ] && [ -f "$FA3/flash_attn_3/_C.abi3.so.xz" ]; then
  xz -dc "$FA3/flash_attn_3/_C.abi3.so.xz" > "$FA3/flash_attn_3/_C.abi3.so" || exit 1
fi
export PYTHONPATH=$FA3:$PYTHONPATH
python3 -c "import flash_attn_interface" || { echo "FA3's wheel does not import"; exit 1; }
echo "$(el) FA3 wheel imported"
if [ "${SPEED:-1}" = 1 ]; then
  python3 bench/speed.py --ops fwd --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,fa3 \
    --budget-s ${BUDGET:-0.2} --pause 0.05 --out "$OUT/speed_fwd_fa3.json" \
    --md "$OUT/speed_fwd_fa3.md" --plot "$OUT/speed_fwd_fa3.png" > "$OUT/speed_fwd_fa3.log" 2>&1
  echo "$(el) speed.py rc=$?"
fi
if [ "${NCU:-1}" = 1 ]; then
  MODES=${MODES:-upstream fa3 gproj} KERNS=fwd_sm90_kernel D=${D:-128} CAUSAL=${CAUSAL:-} \
    bash scripts/ncu_round.sh "${NCU_N:-4096}"
fi
