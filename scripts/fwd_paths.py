"""Why a forward's time in bench/speed.py can differ from scripts/fwd_ab.py's: the same problem
timed through each path. Per shape and candidate (the user API gproj_cuda.attention under
no_grad on requires_grad inputs, as speed.py calls it; the kernel path ops.forward_cuda, as
fwd_ab.py calls it; FlashAttention-3's forward where its wheel imports): the host time per call
(calls queued, no sync), speed.py's back-to-back median (time_cuda) and fwd_ab.py's interleaved
median. Run on a GPU: python scripts/fwd_paths.py [d,N[,causal] ...]"""
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, HERE)
import gproj_cuda  # noqa: E402
from gproj_cuda.ops import forward_cuda  # noqa: E402
from speed import time_cuda  # noqa: E402
from _timing import Case, interleaved  # noqa: E402


def host_us(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # keep the GPU busy so the host never waits on the queue
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    shapes = sys.argv[1:] or ["64,4096,causal", "128,2048", "128,2048,causal", "64,2048"]
    print(f"{'shape':>16} {'candidate':>16} | {'host us':>8} {'b2b ms':>8} {'interl ms':>9}")
    for a in shapes:
        c = Case.parse(a)
        args = c.forward_args()
        qd, kd, vd = (x.detach().clone().requires_grad_() for x in (c.q, c.k, c.v))
        cands = []
        for m in ("gproj", "fa3"):
            def api(m=m):
                with torch.no_grad():
                    return gproj_cuda.attention(qd, kd, vd, causal=c.causal, numerics=m)
            cands.append((f"api {m}", None, api))
            cands.append((f"kernel {m}", None,
                          lambda m=m: forward_cuda(*args, c.scale, -1, c.window_right, m)))
        fa3 = c.fa3()
        if fa3:
            cands.append(("FA3", None, fa3))
        inter = interleaved(cands, "GPROJ_UNUSED", 11)
        for name, _, fn in cands:
            print(f"{a:>16} {name:>16} | {host_us(fn):8.1f} {time_cuda(fn, budget_s=0.2):8.4f} "
                  f"{inter[name]:9.4f}", flush=True)


if __name__ == "__main__":
    main()
