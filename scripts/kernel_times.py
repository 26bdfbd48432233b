"""Every GPU kernel of one forward + backward call, per numerics mode, with its mean time (torch
profiler, CUDA activity), so that fixed costs (pre-passes, memsets, row-state kernels) show beside
the main passes. bf16, B*N = 16k tokens, H*d = 2048 (the bench shapes).
Usage: python scripts/kernel_times.py [d,N[,causal] ...]   (default: 128,2048 and 64,2048)"""
import sys
from collections import defaultdict

import torch
from _timing import Case
from torch.profiler import ProfilerActivity, profile

from gproj_cuda.ops import backward_cuda, forward_cuda


def short(name, width=70):
    name = name.replace("gproj::", "").replace("sm90::", "")
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    reps = 10
    for a in sys.argv[1:] or ["128,2048", "64,2048"]:
        c = Case.parse(a)
        q, k, v, s, wr = c.q, c.k, c.v, c.scale, c.window_right
        do = torch.randn_like(q)
        for mode in ("fa3", "gproj"):
            def step():  # as the ops run them: the forward's key shift handed to the backward
                out, lse, stats, ks = forward_cuda(q, k, v, None, None, c.n, c.n, s, -1, wr, mode,
                                                   return_k_shift=True)
                backward_cuda(do, q, k, v, out, stats, None, None, c.n, c.n, s, -1, wr, mode,
                              k_shift=ks)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    step()
                torch.cuda.synchronize()
            tot, cnt = defaultdict(float), defaultdict(int)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    tot[e.name] += e.device_time if hasattr(e, "device_time") else e.cuda_time
                    cnt[e.name] += 1
            print(f"\n== d={c.d} N={c.n} causal={c.causal} mode={mode}: kernels per call "
                  f"(mean us over {reps} calls)")
            total = 0.0
            for name, t in sorted(tot.items(), key=lambda x: -x[1]):
                total += t / reps
                print(f"  {t / reps:9.1f} us  x{cnt[name] / reps:4.1f}  {short(name)}")
            print(f"  {total:9.1f} us  total")


if __name__ == "__main__":
    main()
