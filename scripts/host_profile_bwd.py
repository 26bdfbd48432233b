"""Where the host time of one backward call goes (B = 1, N = 256, 2 heads, d = 128: a few us of
GPU work per kernel). Wall time per call of ops.backward_cuda and of out.backward(do) through
the user API (median of 7 batches of 100, host_profile.per_call_us), then cProfile's view of 300
backward_cuda calls per mode (tottime) and the torch profiler's (CPU and CUDA) of 20.
Run on a GPU: python scripts/host_profile_bwd.py"""
import os
import sys

import torch
from host_profile import per_call_us, print_cprofile  # (scripts/ is on the path)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gproj_cuda  # noqa: E402
from gproj_cuda import ops  # noqa: E402


def main():
    torch.manual_seed(0)
    B, N, H, d = 1, 256, 2, 128
    s = d ** -0.5
    q, k, v, do = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    rows = []
    for m in ("fa3", "gproj"):
        out, _, st, ks = ops.forward_cuda(q, k, v, None, None, N, N, s, -1, -1, m,
                                          return_k_shift=True)
        bwd = lambda m=m, out=out, st=st, ks=ks: ops.backward_cuda(
            do, q, k, v, out, st, None, None, N, N, s, -1, -1, m, k_shift=ks)
        og = gproj_cuda.attention(qg, kg, vg, numerics=m)
        api_bwd = lambda og=og: og.backward(do, retain_graph=True)
        rows.append((f"ops.backward_cuda {m}", per_call_us(bwd, n=100)))
        rows.append((f"api out.backward {m}", per_call_us(api_bwd, n=100)))
        for name, t in rows[-2:]:
            print(f"{name:32} {t:8.1f} us/call", flush=True)
        print_cprofile(f"ops.backward_cuda {m}", bwd, 300, 22)
    from torch.profiler import ProfilerActivity, profile
    for m in ("fa3", "gproj"):
        out, _, st, ks = ops.forward_cuda(q, k, v, None, None, N, N, s, -1, -1, m,
                                          return_k_shift=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                ops.backward_cuda(do, q, k, v, out, st, None, None, N, N, s, -1, -1, m,
                                  k_shift=ks)
            torch.cuda.synchronize()
        print(f"\n== torch.profiler, 20 calls of ops.backward_cuda {m}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
