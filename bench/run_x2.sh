#!/usr/bin/env bash
# The commands of the two-GPU session (kind nvidia-h200-x2; one `run` each, < 10 minutes), kept
# so that what was run is on record (speed.py with --warm-s 0: timed as then, from an idle GPU).
# Run from the repository root with gproj_cuda's module in place
# (cp _devbuild/_C.cpython-312-*.so gproj_cuda/) and OUT set:
#
#   bash bench/run_x2.sh check numerics ring speed   # command A
#   PT_GPUS=2 bash bench/run_h200.sh pretrain        # command B: six pretraining arms on 2 GPUs
#   bash bench/run_x2.sh sanitize variants           # sanitizers, sm90 forward variants A/B
#   PROBE= HBS=1 BWDVS="0 1 2" HB_IMPLS=gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn bash bench/run_x2.sh hopper
#                                                    # next: the Hopper backward's variants A/B
# (sanitize, variants and hopper use one GPU: they run on nvidia-h200 as well)
source "$(dirname "$0")/_gpu_env.sh"

SPEED_SHAPES="--hdims 128 --seqlens 2048,4096,8192,16384 --gqa-seqlens 16384 --varlen-means 4096 --flex-hdims 128"

check() {   # every GPU test, incl. the NCCL ring test and the partial-mode kernels
  nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv,noheader
  # FlexAttention compiles per shape: fill the compile caches in the background meanwhile
  CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=8 timeout 400 python3 bench/speed.py \
    --impls flex --warm-only $SPEED_SHAPES > "$OUT/flexwarm.log" 2>&1 &
  # kernels not yet run before (the Hopper backward's) go in a process of their own, so that a
  # fault there cannot take the other tests down with it
  NEW_K="lambda_prepass"
  timeout "${TEST_S:-170}" python3 -m pytest tests/test_gpu.py tests/test_distributed.py -m gpu \
    -k "not ($NEW_K)" -q -p no:cacheprovider -rs > "$OUT/pytest.log" 2>&1
  echo "$(el) pytest rc=$?: $(tail -n 1 "$OUT/pytest.log")"
  grep -E "FAILED|Error" "$OUT/pytest.log" | head -20
  timeout 120 python3 -m pytest tests/test_gpu.py -m gpu -k "$NEW_K" -q -p no:cacheprovider -rs \
    > "$OUT/pytest_new.log" 2>&1
  echo "$(el) pytest (new kernels) rc=$?: $(tail -n 1 "$OUT/pytest_new.log")"
  grep -E "FAILED|Error|assert" "$OUT/pytest_new.log" | head -20
}

numerics() {   # the whole SPEC section 5 grid, every backend
  timeout "${NUM_S:-120}" python3 bench/numerics.py --budget-s 100 --out "$OUT/numerics.json" \
    --md "$OUT/numerics.md" --plot "$OUT/numerics.png" > "$OUT/numerics.log" 2>&1
  echo "$(el) numerics rc=$?"
  grep -E "bar \[|median dQ" "$OUT/numerics.log" | head -20
}

ring() {   # ring attention scaling on 1 and 2 GPUs, 32k-128k tokens
  timeout "${RING_S:-170}" python3 bench/ring.py --worlds 1,2 --tokens 32768,65536,131072 \
    --reps 2 --out "$OUT/ring.json" --md "$OUT/ring.md" --plot "$OUT/ring.png" > "$OUT/ring.log" 2>&1
  echo "$(el) ring rc=$?"
  grep -E "check|tok/s|Error|error" "$OUT/ring.log" | head -30
}

speed() {   # causal tile order (sm90 forward) and FlexAttention, side by side with cuDNN
  wait   # the flex warm-up
  echo "$(el) flex warm-up: $(grep -c warmed "$OUT/flexwarm.log") shapes"
  timeout "${SPEED_S:-150}" python3 bench/speed.py --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn,flex \
    $SPEED_SHAPES --budget-s 0.2 --warm-s 0 --pause 0.1 --out "$OUT/speed_x2.json" --md "$OUT/speed_x2.md" > "$OUT/speed_x2.log" 2>&1
  echo "$(el) speed rc=$?"
  tail -n 25 "$OUT/speed_x2.md" 2>/dev/null
}

sanitize() {   # compute-sanitizer on small shapes through every kernel (scripts/sanitize_case.py)
  for tool in memcheck racecheck; do
    timeout "${SAN_S:-240}" compute-sanitizer --tool $tool --print-limit 5 python3 scripts/sanitize_case.py \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "$(el) compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1)"
  done
}

variants() {   # sm90 forward variants (GPROJ_FWD_VARIANT 0-8; VARS picks) side by side with cuDNN, forward only
  for V in ${VARS:-0 1 2 3 4 5}; do
    GPROJ_FWD_VARIANT=$V timeout "${VAR_S:-70}" python3 bench/speed.py \
      --impls gproj_cuda/gproj,gproj_cuda/fa3,sdpa_cudnn --ops fwd --hdims 64,128,256 \
      --seqlens 2048,4096,8192,16384 --gqa-seqlens '' --varlen-means '' --budget-s 0.2 --warm-s 0 --pause 0.05 \
      --out "$OUT/fwd_variant$V.json" --md "$OUT/fwd_variant$V.md" > "$OUT/fwd_variant$V.log" 2>&1
    echo "$(el) variant $V rc=$?"
  done
}

hopper() {   # the Hopper KV-outer backward (fa3, d=128) and the persistent forward variants
  timeout 200 python3 -m pytest tests/test_gpu.py -m gpu -k "hopper or lambda" -q -p no:cacheprovider \
    -rs > "$OUT/pytest_hopper.log" 2>&1
  echo "$(el) pytest hopper rc=$?: $(tail -n 1 "$OUT/pytest_hopper.log")"
  grep -E "^FAILED|Error:|assert" "$OUT/pytest_hopper.log" | head -12
  [ -n "${PROBE-1}" ] && timeout 150 python3 scripts/probe_fwd_variant.py 3 15 | tee "$OUT/probe_variant3.log" | grep -v "ok " | head
  # HBS: GPROJ_HOPPER_BWD values; BWDVS: GPROJ_BWD_VARIANT values (the Hopper backward's variants)
  for HB in ${HBS:-0 1}; do for BV in ${BWDVS:-0}; do
    local tag="$HB$([ "$BV" = 0 ] || echo "_v$BV")"
    GPROJ_HOPPER_BWD=$HB GPROJ_BWD_VARIANT=$BV timeout "${HB_S:-80}" python3 bench/speed.py \
      --impls ${HB_IMPLS:-gproj_cuda/fa3,sdpa_cudnn} \
      --ops bwd --hdims 128 --seqlens 2048,4096,8192,16384 --gqa-seqlens 16384 --varlen-means '' \
      --budget-s 0.2 --warm-s 0 --pause 0.05 --out "$OUT/bwd_hopper$tag.json" --md "$OUT/bwd_hopper$tag.md" \
      > "$OUT/bwd_hopper$tag.log" 2>&1
    echo "$(el) backward speed GPROJ_HOPPER_BWD=$HB GPROJ_BWD_VARIANT=$BV rc=$?"
    grep "| 128" "$OUT/bwd_hopper$tag.md"
  done; done
}

for step in "$@"; do "$step"; done
echo "$(el) all done"
