# Sourced by bench/run_*.sh: output folder, repository root as cwd and on PYTHONPATH, a clock.
set -uo pipefail
OUT=${OUT:-/tmp/gproj_out}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[1]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
