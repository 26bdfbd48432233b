"""Host time per forward call (calls queued without a sync: the CPU time of the Python path,
validation and launches) and wall time per call (GPU-bound when larger), at d = 128 and 256,
N = 1k, with and without a causal mask, with the tile counter and without (GPROJ_FWD_AB=8).
First, the host path alone: a problem too small to keep the GPU busy (B = 1, N = 256, 2 heads,
d = 128: a few us of GPU time per call), through the user API (no grad) and the kernel path
(ops.forward_cuda), both modes interleaved batch by batch, the median of 9 batches of 200 calls.
Run on a GPU: python scripts/host_cost.py"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gproj_cuda.ops import forward_cuda  # noqa: E402


def per_call_us(fn, n=300):
    """(host, wall) microseconds per call: n calls queued, then one synchronize."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def host_path():
    import gproj_cuda
    q, k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cands = {}
    for m in ("fa3", "gproj"):
        cands[f"api {m}"] = lambda m=m: gproj_cuda.attention(q, k, v, numerics=m)
        cands[f"kernel path {m}"] = lambda m=m: forward_cuda(q, k, v, None, None, 256, 256,
                                                             128 ** -0.5, -1, -1, m)
    times = {name: [] for name in cands}
    with torch.no_grad():
        for _ in range(9):
            for name, fn in cands.items():
                times[name].append(per_call_us(fn, n=200)[1])
    for name, t in times.items():
        print(f"host path (B=1, N=256, d=128), {name:17}: {sorted(t)[len(t) // 2]:6.1f} us/call",
              flush=True)


def main():
    torch.manual_seed(0)
    host_path()
    for d in (128, 256):
        B, N, H = 16, 1024, 16 if d == 128 else 8
        q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for wr in (-1, 0):
            for ab in ("", "8"):
                os.environ["GPROJ_FWD_AB"] = ab
                for m in ("fa3", "gproj"):
                    host, wall = per_call_us(
                        lambda: forward_cuda(q, k, v, None, None, N, N, d ** -0.5, -1, wr, m))
                    print(f"d={d} causal={wr == 0} ab={ab or '-'} {m:5}: host {host:6.1f} us/call, "
                          f"wall {wall:6.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
