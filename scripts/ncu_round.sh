#!/usr/bin/env bash
# Nsight Compute on the Hopper kernels (backward KV pass, λ pre-pass, forward), one steady-state
# launch each: speed-of-light, warp stalls, shared-memory conflicts, and per-line stall samples.
#   OUT=... [MODES="fa3 gproj"] [KERNS=...] [D=128] [CAUSAL=causal] bash scripts/ncu_round.sh [N]
# MODES may include "upstream": FlashAttention-3's own forward kernel (scripts/fa3_side.sh puts
# its wheel on PYTHONPATH; its kernel is a cutlass::device_kernel<...>, whatever KERNS says).
source "$(dirname "$0")/../bench/_gpu_env.sh"
N=${1:-4096}
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
 --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SourceCounters \
 --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats"
for num in ${MODES:-fa3 gproj}; do
  for kern in ${KERNS:-bwd_kv_sm90 fwd_sm90_kernel}; do
    rep="$OUT/ncu_${num}_${kern}_d${D:-128}_n${N}${CAUSAL:+_causal}"
    regex=$kern
    [ "$num" = upstream ] && regex=device_kernel
    [ "$num" = upstream_bwd ] && regex=FlashAttnBwdSm90
    base=function
    [ "$num" = upstream_bwd ] && base=demangled  # (every FA3 kernel is a cutlass::device_kernel)
    timeout 150 ncu --kernel-name-base $base -k "regex:$regex" -s 1 -c 1 $SECTIONS --import-source yes -f -o "$rep" \
      python3 scripts/ncu_case.py $num $N ${D:-128} ${CAUSAL:-} > "$rep.log" 2>&1
    echo "$(el) ncu $num $kern rc=$?"
    ncu -i "$rep.ncu-rep" --page details > "$rep.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>/dev/null
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Warp Cycles Per Issued|Executed Ipc Active|Issue Slots Busy|Bank Conflicts|One or More Eligible" "$rep.txt" | head -14
    python3 scripts/ncu_regions.py "$rep.sass.csv" 2 > "$rep.regions.txt" 2>&1
  done
done
