#!/usr/bin/env bash
# Build gproj_cuda._C for another Python (default python3.12, the GPU machine's) into _devbuild/,
# so a GPU session can carry a ready module instead of compiling there.
#   scripts/devbuild.sh [python] [extra cmake -D args...]
set -euo pipefail
PY=${1:-python3.12}; shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)
"$PY" -m pip -q install pybind11 >/dev/null 2>&1 || true
CUTLASS=$(python3 "$ROOT/gproj_cuda/_toolchain.py")
cmake -S "$ROOT" -B "$ROOT/_devbuild/cmake-$("$PY" -c 'import sys; print(sys.version_info[1])')" -GNinja \
  -DPython_EXECUTABLE="$(command -v "$PY")" -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" \
  -DGPROJ_CUTLASS_INCLUDE="$CUTLASS" -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$ROOT/_devbuild" \
  -DGPROJ_CUDA_ARCHS="${GPROJ_CUDA_ARCHS:-90a}" "$@" >/dev/null
cmake --build "$ROOT/_devbuild/cmake-$("$PY" -c 'import sys; print(sys.version_info[1])')" -j "$(nproc)"
ls -la "$ROOT"/_devbuild/*.so
