"""Whether two builds of the extension give bitwise the same gradients (a refactor's check):
the Hopper backward of both numerics modes at every head dim, dense, causal, GQA and varlen, the
forward's softmax state taken from this build for both. dQ where it is summed by reduce-adds in a
varying order (fa3 mode, gproj at d = 256) may differ by one bf16 ulp where that order flips a
rounding (as between two runs of one build), so it is compared elementwise within that, as
tests/test_gpu.py's test_hopper_backward_passes_under_predecessor_tail does.
Usage (from scripts/): python same_bits.py OTHER_BUILD.so"""
import itertools
import sys

import torch
from _timing import with_library

from gproj_cuda.ops import backward_cuda, forward_cuda

other = with_library(sys.argv[1])
torch.manual_seed(0)
fails = 0
for d, numerics, case in itertools.product((64, 128, 256), ("gproj", "fa3"),
                                           ("dense", "causal", "gqa", "varlen")):
    h, hk = (8, 2) if case == "gqa" else (8, 8)
    causal = case != "dense"
    if case == "varlen":
        lens = [700, 0, 1500, 333]
        cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
        shp_q, shp_k, mx = (sum(lens), h, d), (sum(lens), hk, d), max(lens)
    else:
        cu, shp_q, shp_k, mx = None, (2, 1024, h, d), (2, 1024, hk, d), 1024
    q, do = (torch.randn(shp_q, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(shp_k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[..., 0] += 6
    wr = 0 if causal else -1
    s = d ** -0.5
    out, _, st = forward_cuda(q, k, v, cu, cu, mx, mx, s, -1, wr, numerics)
    run = lambda: backward_cuda(do, q, k, v, out, st, cu, cu, mx, mx, s, -1, wr, numerics,
                                hopper=True)
    a, b = run(), other(run)()
    torch.cuda.synchronize()
    for name, x, y in zip(("dq", "dk", "dv"), a, b):
        loose = name == "dq" and (numerics == "fa3" or d == 256)
        if loose:
            bound = 2.0 ** -7 * y.float().abs() + 1e-4 * y.float().abs().max()
            ok = bool(((x.float() - y.float()).abs() <= bound).all())
        else:
            ok = torch.equal(x, y)
        fails += not ok
        if not ok:
            print(f"DIFFER d={d} {numerics} {case} {name}: max |diff| "
                  f"{(x.float() - y.float()).abs().max().item():.3e}")
print(f"{'same' if fails == 0 else 'NOT the same'}: {fails} of {3 * 24} outputs differ")
sys.exit(1 if fails else 0)
