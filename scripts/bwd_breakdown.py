"""Where the Hopper backward's time goes (d=128, bf16, B*N = 16k tokens, H = 16): the whole
backward per numerics mode and backend, key centering, and the λ-only pre-pass (the first kernel
of GPROJ_BWD_VARIANT=4; the default's Q-outer pass also computes dQ: `KERNELS=1 python
scripts/bwd_ab.py` times each kernel of a backward), CUDA-event medians.
Usage: python scripts/bwd_breakdown.py [N ...]"""
import sys

import torch
from _timing import timed

from gproj_cuda.ops import backward_cuda, center_keys_cuda, forward_cuda, rowstate_cuda


def main():
    for n in [int(x) for x in sys.argv[1:]] or [4096, 16384]:
        B, H, d = 16384 // n, 16, 128
        q, k, v, do = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        s = d ** -0.5
        row = {}
        for num in ("fa3", "gproj"):
            out, _, st = forward_cuda(q, k, v, None, None, n, n, s, -1, -1, num)
            for hop in (False, True):
                row[f"{num} bwd {'hopper' if hop else 'mma.sync'}"] = timed(
                    lambda: backward_cuda(do, q, k, v, out, st, None, None, n, n, s, -1, -1, num,
                                          hopper=hop))
        out, _, st = forward_cuda(q, k, v, None, None, n, n, s, -1, -1, "gproj")
        row["center K (or Q)"] = timed(lambda: center_keys_cuda(k, None, n))
        row["λ-only pre-pass (+ centering)"] = timed(
            lambda: rowstate_cuda(q, k, v, out, st, do, s, -1, -1))
        flops = 4 * B * H * n * n * d * 2.5
        print(f"N={n} B={B} H={H} d={d} (bwd FLOPs {flops / 1e12:.2f} T)")
        for name, ms in row.items():
            print(f"  {name:24s} {ms:8.3f} ms  {flops / ms / 1e9:6.0f} TFLOPS-equiv")


if __name__ == "__main__":
    main()
