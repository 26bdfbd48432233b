#!/usr/bin/env bash
# Build gproj_cuda._C for another Python (default python3.12, the GPU machine's) into _devbuild/,
# so a GPU session can carry a ready module instead of compiling there.
#   scripts/devbuild.sh [python] [extra cmake -D args...]
set -euo pipefail
PY=${1:-python3.12}; shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$PY" -m pip -q install pybind11 >/dev/null 2>&1 || true
CUTLASS=$(python3 "$ROOT/gproj_cuda/_toolchain.py")
BUILD="$ROOT/_devbuild/cmake-$("$PY" -c 'import sys; print(sys.version_info[1])')"
cmake -S "$ROOT" -B "$BUILD" -GNinja \
  -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
  -DGPROJ_CUTLASS_INCLUDE="$CUTLASS" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/_devbuild" \
  -DGPROJ_CUDA_ARCHS="${GPROJ_CUDA_ARCHS:-90a}" "$@" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
# An object whose header dependencies ninja did not record is never rebuilt after a header edit
# (session 14 found all six instantiation objects so, and ran a stale build): delete it, so that
# the next build compiles it again.
stale=$(ninja -C "$BUILD" -t deps 2>/dev/null | sed -n 's/^\(.*\.o\): #deps 0,.*/\1/p')
if [ -n "$stale" ]; then
  echo "devbuild: no header dependencies recorded for: $stale; deleted, rebuild again" >&2
  for o in $stale; do rm -f "$BUILD/$o"; done
  exit 1
fi
ls -la "$ROOT"/_devbuild/*.so
