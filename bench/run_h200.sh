#!/usr/bin/env bash
# The two H200 commands of the issue 4 / issue 6 session (one `run` each, < 10 minutes), kept
# here so that what was run is on record. Run from the repository root with gproj_cuda's module
# in place (cp _devbuild/_C.cpython-312-*.so gproj_cuda/) and OUT set:
#
#   bash bench/run_h200.sh speed      # GPU tests, then bench/speed.py with every importable peer
#   bash bench/run_h200.sh pretrain   # the six pretraining arms side by side on the one GPU
#
# Knobs (environment): SPEED_S (seconds for speed.py, default 240), TEST_S (pytest, 150),
# WARM_UNTIL_S (stop waiting for the flex compiles then, 175), PT_DEADLINE_S (pretrain: every run
# stops by start + this, default 530), PT_PROBE_S (45), PT_EXTRA (extra pretrain.py flags, e.g.
# --smoke for a CPU check of this script), PT_GPUS (pretrain: 2 puts the default-setting arms on
# GPU 0 and the stress arms on GPU 1; default 1).
source "$(dirname "$0")/_gpu_env.sh"

speed() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  # FlexAttention compiles one graph per shape: compile its shapes in two background processes
  # while the tests run (fills the inductor/Triton disk caches; the timed run then only traces)
  local SHAPES="--hdims 64,128,256 --seqlens 1024,2048,4096,8192,16384 --gqa-seqlens 4096,16384 --varlen-means 1024,4096"
  for i in 0 1; do
    TORCHINDUCTOR_COMPILE_THREADS=4 timeout 200 python3 bench/speed.py --impls flex --warm-only \
      --flex-hdims 128 $SHAPES --shard $i/2 > "$OUT/flexwarm$i.log" 2>&1 &
  done
  timeout "${TEST_S:-150}" python3 -m pytest tests/test_gpu.py -q -x -p no:cacheprovider \
    > "$OUT/pytest.log" 2>&1
  echo "$(el) pytest rc=$?: $(tail -n 1 "$OUT/pytest.log")"
  while [ -n "$(jobs -pr)" ] && [ $(( $(date +%s) - T0 )) -lt "${WARM_UNTIL_S:-175}" ]; do sleep 2; done
  for p in $(jobs -pr); do kill $p 2>/dev/null; done
  wait
  echo "$(el) flex warm-up done: $(grep -c warmed "$OUT"/flexwarm*.log | tr '\n' ' ')"
  # (--warm-s 0: timed as when this was run; bench/speed.py warms 0.3 s per op since session 34)
  timeout "${SPEED_S:-240}" python3 bench/speed.py $SHAPES --flex-hdims 128 --budget-s 0.2 --warm-s 0 \
    --pause 0.1 --out "$OUT/speed_new.json" --md "$OUT/speed_new.md" > "$OUT/speed.log" 2>&1
  echo "$(el) speed rc=$?"
  grep -E "^\s+\[|done|unavailable" "$OUT/speed.log" | cut -c1-150 | tail -n 60
}

# PT_GPUS=2: the default setting on GPU 0, the stress setting on GPU 1.
gpu_of() { if [ "${PT_GPUS:-1}" = 2 ] && [ "$1" = all ]; then echo 1; else echo 0; fi; }

pretrain() {
  local D=$(( T0 + ${PT_DEADLINE_S:-530} )) P=/tmp/pt_probe W=$OUT/pretrain
  mkdir -p $P "$W"
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
  # 1. probe: all six processes at once for PT_PROBE_S seconds, to measure the shared step rates
  #    (PT_STEPS="<none> <all>" skips it and sets the steps directly)
  for stress in none all; do for arm in fa3 gproj fp32; do
    [ -n "${PT_STEPS:-}" ] && continue
    CUDA_VISIBLE_DEVICES=$(gpu_of $stress) \
    python3 bench/pretrain.py --arm $arm --stress $stress --steps 5000 --log-every 10 \
      --eval-every 100000 --ckpt-every 0 --time-budget-s "${PT_PROBE_S:-45}" --workdir $P \
      --tqdm off ${PT_EXTRA:-} > $P/$arm-$stress.log 2>&1 &
  done; done
  wait
  echo "$(el) probe done"
  # 2. steps per setting: the six processes share the GPU's time; their total GPU work
  #    (sum of steps / (processes x shared rate)) must fit 75% of what is left before the deadline
  [ -n "${PT_STEPS:-}" ] && read SN SA <<< "$PT_STEPS"
  [ -z "${PT_STEPS:-}" ] && read SN SA < <(python3 - "$P" "$D" "${PT_GPUS:-1}" <<'EOF'
import json, glob, sys, time, os
P, D, NGPU = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rate = {}
for arm in ("fa3", "gproj", "fp32"):
    for st in ("none", "all"):
        name = f"{arm}-{st}"
        if not os.path.exists(os.path.join(P, name + ".summary.json")):
            # a probe that died (no summary) says nothing about the rate: leave it out of the
            # estimate and say so loudly (its real run will most likely die the same way)
            print(f"{name}: PROBE FAILED:", "".join(open(os.path.join(P, name + ".log"))
                                                   .readlines()[-3:]), file=sys.stderr)
            continue
        rs = [json.loads(l) for l in open(os.path.join(P, name + ".jsonl")) if l.strip()]
        rs = [r for r in rs if r["step"] >= 10]
        rate[name] = ((rs[-1]["step"] - rs[0]["step"]) / (rs[-1]["elapsed_s"] - rs[0]["elapsed_s"])
                      if len(rs) >= 2 else 0.2)     # alive but slower than 20 steps per probe
        print(name, "steps/s shared:", round(rate[name], 2), file=sys.stderr)
avail = 0.75 * (D - time.time() - 40)          # start-up and final evaluation/checkpoint
def work(sn, sa):          # seconds under equal time sharing of the busiest GPU
    per_gpu = {}
    for arm in ("fa3", "gproj", "fp32"):
        for st, s in (("none", sn), ("all", sa)):
            if f"{arm}-{st}" in rate:
                g = 1 if NGPU == 2 and st == "all" else 0
                per_gpu[g] = per_gpu.get(g, 0) + s / (len(rate) / NGPU * rate[f"{arm}-{st}"])
    return max(per_gpu.values(), default=0)
sn = 3000
while sn > 400 and work(sn, min(2000, round(0.75 * sn / 50) * 50)) > avail:
    sn -= 50
sa = min(2000, round(0.75 * sn / 50) * 50)
print(f"avail {avail:.0f} s -> steps none {sn}, all {sa} (est. {work(sn, sa):.0f} s)", file=sys.stderr)
print(sn, sa)
EOF
)
  echo "$(el) steps: none $SN, all $SA; deadline in $(( D - $(date +%s) )) s"
  # 3. the six runs, side by side; a run that dies is resumed once from its last checkpoint
  for stress in none all; do for arm in fa3 gproj fp32; do
    S=$SN; [ $stress = all ] && S=$SA
    ( export CUDA_VISIBLE_DEVICES=$(gpu_of $stress)
      A="--arm $arm --stress $stress --steps $S --workdir $W --ckpt-dir /tmp/ckpt-$arm-$stress --deadline $D --time-budget-s 100000 --tqdm off ${PT_EXTRA:-}"
      timeout $(( D + 45 - $(date +%s) )) python3 bench/pretrain.py $A \
      || { [ $(date +%s) -lt $(( D - 60 )) ] && timeout $(( D + 45 - $(date +%s) )) python3 bench/pretrain.py $A --resume; }
    ) > "$W/$arm-$stress.log" 2>&1 &
  done; done
  wait
  echo "$(el) runs done"
  mkdir -p "$W/probe" && cp $P/*.jsonl $P/*.log $P/*.json "$W/probe/" 2>/dev/null
  tail -q -n 1 "$W"/*.log
  tar czf "$OUT/pretrain.tgz" -C "$W" . && rm -rf "$W"
}

for step in "$@"; do "$step"; done
echo "$(el) all done"
