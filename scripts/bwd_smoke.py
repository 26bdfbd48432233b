"""A first look at a changed Hopper backward before the test suite: each gproj variant (and fa3
mode) once at d = 64 and 128, dense causal and GQA, against the mma.sync passes (relative
difference of dQ, dK, dV) and for NaN. Usage: python scripts/bwd_smoke.py"""
import os

import torch

from gproj_cuda.ops import backward_cuda, forward_cuda


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    torch.manual_seed(0)
    for d in (64, 128):
        for (B, nq, nk, H, Hk, causal) in ((2, 700, 700, 4, 4, True), (1, 1000, 1300, 8, 2, False)):
            q, do = (torch.randn(B, nq, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.randn(B, nk, Hk, d, device="cuda", dtype=torch.bfloat16) + 2 for _ in range(2))
            s, wr = d ** -0.5, (0 if causal else -1)
            # (fa3 mode's 13 / 14: per-warpgroup dQ at d = 64 / 128; 15: d = 64's dQ GEMM split
            # by head-dim halves. Each runs the default at the head dims it does not cover)
            for m, variants in (("fa3", ["0", "13", "14", "15"]), ("gproj", ["0", "3", "4", "6"])):
                out, _, st = forward_cuda(q, k, v, None, None, nq, nk, s, -1, wr, m)
                base = backward_cuda(do, q, k, v, out, st, None, None, nq, nk, s, -1, wr, m, hopper=False)
                for var in variants:
                    os.environ["GPROJ_BWD_VARIANT"] = var
                    got = backward_cuda(do, q, k, v, out, st, None, None, nq, nk, s, -1, wr, m, hopper=True)
                    torch.cuda.synchronize()
                    diffs = " ".join(f"{n} {rel(g, b_):.2e}" for n, g, b_ in zip(("dq", "dk", "dv"), got, base))
                    nan = any(not torch.isfinite(g).all() for g in got)
                    print(f"d={d} {B}x{nq}x{nk} H={H}/{Hk} causal={causal} {m} v{var}: {diffs}"
                          f"{'  NaN!' if nan else ''}", flush=True)
    os.environ["GPROJ_BWD_VARIANT"] = "0"


if __name__ == "__main__":
    main()
