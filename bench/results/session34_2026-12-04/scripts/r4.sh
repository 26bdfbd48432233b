#!/usr/bin/env bash
source scripts/device_prelude.sh
nvidia-smi --query-gpu=power.limit,enforced.power.limit,clocks.max.sm,clocks.applications.graphics --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
python3 - <<'PY' 2>&1 | tee $OUT/clock_probe.txt
import sys, time, torch
sys.path.insert(0, "scripts"); sys.path.insert(0, "bench"); sys.path.insert(0, ".")
from _timing import Case
from gproj_cuda.ops import forward_cuda
c = Case.parse("128,2048"); args = c.forward_args()
fa3 = c.fa3()
for name, fn in (("kernel fa3", lambda: forward_cuda(*args, c.scale, -1, -1, "fa3")), ("FA3", fa3),
                 ("kernel gproj", lambda: forward_cuda(*args, c.scale, -1, -1, "gproj"))):
    # 2 s back to back, reporting the median of each 0.1 s window
    for _ in range(5): fn()
    torch.cuda.synchronize()
    t_start = time.time()
    print(f"{name}: start {t_start:.2f}", flush=True)
    windows = []
    while time.time() - t_start < 2.0:
        evs = []
        for _ in range(150):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); evs.append((a, b))
        torch.cuda.synchronize()
        ts = sorted(a.elapsed_time(b) for a, b in evs)
        windows.append((time.time() - t_start, ts[len(ts)//2]))
    print(name, " ".join(f"{t:.2f}s:{m:.4f}" for t, m in windows), flush=True)
    time.sleep(1.0)
PY
kill $SMI
