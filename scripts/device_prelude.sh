# Sourced by a GPU round's script on the lent machine, from the repository root: unpacks the
# extension built here (scripts/devbuild.sh, carried as _wheels/_C.so.xz) and FlashAttention-3's
# forward wheel (unpacked under _wheels/fa3, its library carried as .so.xz: the carried tree is
# limited to 64 MiB), puts the repository and the wheel on PYTHONPATH; el prints the seconds
# since the start. Carry: _wheels/_C.so.xz, _wheels/fa3 and the round's script.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
xz -dc _wheels/_C.so.xz > gproj_cuda/_C.cpython-312-x86_64-linux-gnu.so || exit 1
if [ -f _wheels/fa3/flash_attn_3/_C.abi3.so.xz ]; then
  (cd _wheels/fa3/flash_attn_3 && xz -dc _C.abi3.so.xz > _C.abi3.so) || exit 1
fi
export PYTHONPATH=$PWD:$PWD/_wheels/fa3
