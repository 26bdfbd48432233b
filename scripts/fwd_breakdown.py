"""Where the Hopper forward's time goes, per shape (bf16, B*N = 16k tokens, H*d = 2048): cuDNN's
forward, ours in fa3 mode, ours in gproj mode, and gproj's two pieces (key centering, lazy as in
the forward: random keys need no K'; the kernel alone on already centered keys), CUDA-event
medians in one process, so the ratios travel.
Usage: python scripts/fwd_breakdown.py [d,N[,causal] ...]   (default: a small grid)"""
import sys

import torch
from _timing import Case, timed

from gproj_cuda.ops import center_keys_cuda, forward_cuda, forward_kernel


def main():
    args = sys.argv[1:] or ["64,2048", "64,16384", "128,2048", "128,2048,causal", "128,16384",
                            "256,2048", "256,16384"]
    print(f"{'d':>4} {'N':>6} {'causal':>6} | {'cuDNN':>7} {'fa3':>7} {'gproj':>7} | "
          f"{'center':>7} {'kernel':>7} | fa3/cuDNN gproj/cuDNN kernel/fa3")
    for a in args:
        c = Case.parse(a)
        d, n, causal, B, H = c.d, c.n, c.causal, c.B, c.H
        q, k, v, s, wr = c.q, c.k, c.v, c.scale, c.window_right
        kc, shift = center_keys_cuda(k, None, n)
        t = {}
        t["cudnn"] = timed(c.cudnn, 30)
        t["fa3"] = timed(lambda: forward_cuda(q, k, v, None, None, n, n, s, -1, wr, "fa3"), 30)
        t["gproj"] = timed(lambda: forward_cuda(q, k, v, None, None, n, n, s, -1, wr, "gproj"), 30)
        flags = torch.empty((B, H), dtype=torch.int32, device="cuda")
        t["center"] = timed(lambda: center_keys_cuda(k, None, n, flags=flags), 30)  # lazy, as forward
        # the kernel alone on keys centered beforehand (what forward_cuda launches last)
        t["kernel"] = timed(lambda: forward_kernel(q, kc, v, None, None, n, n, s, -1, wr, "gproj",
                                                   k_shift=shift), 30)
        torch.cuda.synchronize()
        print(f"{d:4d} {n:6d} {str(causal):>6} | " +
              " ".join(f"{t[x]:7.3f}" for x in ("cudnn", "fa3", "gproj")) + " | " +
              " ".join(f"{t[x]:7.3f}" for x in ("center", "kernel")) +
              f" | {t['cudnn'] / t['fa3']:9.3f} {t['cudnn'] / t['gproj']:11.3f}"
              f" {t['fa3'] / t['kernel']:11.3f}")


if __name__ == "__main__":
    main()
