# Session 27 timing-only diagnostic: needs the "diag" build (GPROJ_DIAG_DQ_RED_STEPS: diag_dq_red_steps.patch, not in the code;
# bench/results/session27_2026-12-03/README.md). fa3 backward at d=256, dQ reductions all / half / none.
import os, torch
from gproj_cuda.ops import backward_cuda, forward_cuda
def t(B, N, H, steps, reps=20):
    os.environ["GPROJ_DIAG_DQ_RED_STEPS"] = str(steps)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, N, H, 256, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    s = 256 ** -0.5
    out, _, st = forward_cuda(q, k, v, None, None, N, N, s, -1, -1, "fa3")
    f = lambda: backward_cuda(do, q, k, v, out, st, None, None, N, N, s, -1, -1, "fa3", hopper=True)
    for _ in range(3): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(reps): f()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps
for B, N, H in ((1, 4096, 1), (1, 4096, 2), (1, 8192, 1), (2, 8192, 1), (1, 8192, 2), (2, 8192, 4)):
    blocks = B * H * N // 64
    r = [t(B, N, H, s) for s in (16, 8, 0)]
    print(f"B={B} N={N} H={H} blocks={blocks}: steps16 {r[0]:.3f} ms, steps8 {r[1]:.3f}, steps0 {r[2]:.3f}; red cost {100*(r[0]/r[2]-1):.1f}% (half: {100*(r[1]/r[2]-1):.1f}%)")
