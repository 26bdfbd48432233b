"""Energy per call, back to back: each candidate's forward queued for --seconds, the GPU's energy
counter (NVML, millijoules) and SM clock sampled around it. Under a sustained load the H200 sits
at its 700 W cap (bench/NOTES.md session 34 item 3), so the clock, and with it the time per
call, follows the energy per call. Prints, per shape and candidate: median ms per call, energy
per call (mJ), mean power (W), median SM clock (MHz) over the window.
Run on a GPU: python scripts/energy_probe.py [--seconds 2] [--modes fa3,gproj] [--no-fa3]
    [--env NAME=V1,V2,...] [d,N[,causal][,gqa] ...]
--bwd V1,V2,...: the backward instead (bwd_ab.py's candidates: cuDNN, fa3 mode with those
GPROJ_BWD_VARIANT values, gproj's default, and FlashAttention-3's backward where AB_FA3_BWD names
its folder), the same window per candidate.
--env makes one candidate per value of that switch and mode (the kernels read GPROJ_FWD_AB,
GPROJ_TILE_ORDER and GPROJ_FWD_VARIANT at every call; "-" leaves it unset)."""
import argparse
import os
import statistics
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from gproj_cuda.ops import forward_cuda  # noqa: E402
from _timing import Case  # noqa: E402


def nvml_handle():
    import pynvml
    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def run(fn, seconds, nv, h):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    time.sleep(1.0)  # back under the cap's threshold: every candidate starts alike
    clocks, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            clocks.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            time.sleep(0.02)
    th = threading.Thread(target=sample)
    e0, t0 = nv.nvmlDeviceGetTotalEnergyConsumption(h), time.perf_counter()
    th.start()
    calls, times = 0, []
    while time.perf_counter() - t0 < seconds:
        evs = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            evs.append((a, b))
        torch.cuda.synchronize()
        calls += len(evs)
        times += [a.elapsed_time(b) for a, b in evs]
    t1, e1 = time.perf_counter(), nv.nvmlDeviceGetTotalEnergyConsumption(h)
    stop.set()
    th.join()
    # the second half of the window: the cap has acted by then
    tail = times[len(times) // 2:]
    return (statistics.median(tail), (e1 - e0) / calls, (e1 - e0) / 1e3 / (t1 - t0),
            statistics.median(clocks[len(clocks) // 2:]) if clocks else float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--modes", default="fa3,gproj")
    ap.add_argument("--no-fa3", action="store_true", help="leave FlashAttention-3 out")
    ap.add_argument("--env", default=None, help="NAME=V1,V2,...: a candidate per value")
    ap.add_argument("--bwd", default=None, help="V1,V2,...: the backward, fa3 mode's variants")
    ap.add_argument("shapes", nargs="*", default=["128,2048", "64,4096,causal", "256,2048"])
    args = ap.parse_args()
    env_name, env_vals = (args.env.split("=", 1)[0], args.env.split("=", 1)[1].split(",")) \
        if args.env else (None, [None])
    nv, h = nvml_handle()

    def measure(shape, name, fn):
        ms, mj, w, mhz = run(fn, args.seconds, nv, h)
        print(f"{shape:>16} {name:>12} | {ms:7.4f} {mj:8.1f} {w:6.0f} {mhz:6.0f}", flush=True)

    print(f"{'shape':>16} {'candidate':>12} | {'ms':>7} {'mJ/call':>8} {'W':>6} {'MHz':>6}", flush=True)
    for a in args.shapes:
        c = Case.parse(a)
        if args.bwd:
            from bwd_ab import candidates
            for name, var, fn in candidates(c, ["0"], None, args.bwd.split(",")):
                os.environ["GPROJ_BWD_VARIANT"] = var or "0"
                measure(a, name, fn)
            os.environ["GPROJ_BWD_VARIANT"] = "0"
            continue
        fa = c.fa3()
        cands = [("FA3", None, fa)] if fa and not args.no_fa3 else []
        cands += [(m + ("" if v is None else f" {v}"), v,
                   lambda m=m: forward_cuda(*c.forward_args(), c.scale, -1, c.window_right, m))
                  for m in args.modes.split(",") for v in env_vals]
        for name, val, fn in cands:
            if env_name:
                os.environ.pop(env_name, None)
                if val not in (None, "-"):
                    os.environ[env_name] = val
            measure(a, name, fn)


if __name__ == "__main__":
    main()
