#!/usr/bin/env bash
# One GPU round: install the prebuilt module (or build it), run the test suite, sanitizers and a
# quick speed table. Usage on the device: bash scripts/gpu_round.sh [tests|sanitize|speed|all]...
set -uo pipefail
OUT=${OUT:-/tmp/gproj_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls _devbuild/_C.cpython-312-*.so >/dev/null 2>&1; then
  cp _devbuild/_C.cpython-312-*.so gproj_cuda/
else
  pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
python3 -c "import gproj_cuda as g; print('available:', g.is_available(), g.unavailable_reason(), g.compiled_configs())"
for step in "${@:-all}"; do
  case $step in
    tests|all)
      timeout 420 python3 -m pytest tests -q -rfEs --maxfail=15 --durations=8 2>&1 | tee "$OUT/pytest.log" | tail -40 ;;&
    sanitize|all)
      for tool in memcheck racecheck; do
        timeout 200 compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py > "$OUT/sanitize_$tool.log" 2>&1
        echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
      done ;;&
    speed|all)
      timeout 300 python3 bench/speed.py --quick --out "$OUT/speed_quick.json" 2>&1 | tail -20 ;;
  esac
done
