"""Where the host time of one forward call goes, piece by piece, on a problem too small to keep
the GPU busy (B = 1, N = 256, 2 heads, d = 128). Each piece is timed alone in a loop of queued
calls (median of 7 batches of 300; wall time, so a piece that launches work is bounded by the GPU
only if its launches outrun the host), then cProfile's view of the whole kernel path and of the
API with grad. Run on a GPU: python scripts/host_profile.py"""
import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gproj_cuda  # noqa: E402
from gproj_cuda import _ext, ops  # noqa: E402


def per_call_us(fn, n=300, batches=7):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(ts)[len(ts) // 2]


def print_cprofile(name, fn, calls, top):
    """cProfile's view (tottime, the top entries) of ``calls`` queued calls of ``fn``."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    print(f"\n== cProfile, {calls} calls of {name} (tottime, top {top})")
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda", torch.cuda.current_device())
    C = _ext.extension()
    B, N, H, d = 1, 256, 2, 128
    q, k, v = (torch.randn(B, N, H, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    scale = d ** -0.5

    def prepared(numerics):
        p = ops._params(q, k, v, None, None, N, N, scale, -1, -1, numerics)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, N, device=dev)
        stats = torch.empty(B, H, N, 2, device=dev)
        p.out, p.o_stride = out.data_ptr(), ops._strides3(out, False)
        p.lse, p.stats = lse.data_ptr(), stats.data_ptr()
        keep = [out, lse, stats]
        if numerics == "gproj":
            shape = ops._k_shift_shape(k, None)
            pairs = shape[0] * shape[1]
            work = torch.empty(2 * pairs * shape[2] + 4 + pairs, dtype=torch.int32, device=dev)
            kc, shift = torch.empty_like(k), torch.empty(shape, dtype=k.dtype, device=dev)
            p.center_workspace = work.data_ptr()
            p.k_centered, p.kc_stride = kc.data_ptr(), ops._strides3(kc, False)
            p.k_shift = shift.data_ptr()
            p.k_center_flags = work.data_ptr() + 4 * (2 * pairs * shape[2] + 4)
            keep += [work, kc, shift]
        return p, keep

    pf, keep_f = prepared("fa3")
    pg, keep_g = prepared("gproj")
    pieces = {
        "torch.empty (1 small cuda tensor)": lambda: torch.empty(256, device=dev),
        "torch.cuda.current_stream().cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "ops._stream (raw handle)": lambda: ops._stream(dev),
        "_ext.unavailable_reason": lambda: _ext.unavailable_reason(0),
        "ops._params (C.Params + fields)": lambda: ops._params(q, k, v, None, None, N, N, scale,
                                                                 -1, -1, "fa3"),
        "C.forward(p) fa3 (prepared p)": lambda: C.forward(pf),
        "C.center_keys(p) (prepared p)": lambda: C.center_keys(pg),
        "C.forward(p) gproj (prepared p)": lambda: C.forward(pg),
        "ops.forward_cuda fa3": lambda: ops.forward_cuda(q, k, v, None, None, N, N, scale, -1,
                                                         -1, "fa3"),
        "ops.forward_cuda gproj": lambda: ops.forward_cuda(q, k, v, None, None, N, N, scale, -1,
                                                           -1, "gproj"),
        "api fa3, no grad": lambda: gproj_cuda.attention(q, k, v, numerics="fa3"),
        "api gproj, no grad": lambda: gproj_cuda.attention(q, k, v, numerics="gproj"),
        "api fa3, grad (forward only)": lambda: gproj_cuda.attention(qg, kg, vg, numerics="fa3"),
        "api gproj, grad (forward only)": lambda: gproj_cuda.attention(qg, kg, vg,
                                                                       numerics="gproj"),
    }
    rows = []
    for name, fn in pieces.items():
        rows.append((name, per_call_us(fn)))
        print(f"{name:42} {rows[-1][1]:7.1f} us/call", flush=True)
    ops.EAGER_FAST_PATH = False
    for name in ("api fa3, no grad", "api gproj, no grad", "api fa3, grad (forward only)",
                 "api gproj, grad (forward only)"):
        t = per_call_us(pieces[name])
        rows.append((name + " [op path]", t))
        print(f"{name + ' [op path]':42} {t:7.1f} us/call", flush=True)
    ops.EAGER_FAST_PATH = True

    for name, fn in (("ops.forward_cuda gproj", pieces["ops.forward_cuda gproj"]),
                     ("api gproj, grad (forward only)", pieces["api gproj, grad (forward only)"])):
        print_cprofile(name, fn, 500, 18)
    print("\n== summary (us per call, wall, queued calls)")
    for name, t in rows:
        print(f"{name:52} {t:7.1f}")


if __name__ == "__main__":
    main()
