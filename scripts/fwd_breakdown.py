"""Where the Hopper forward's time goes, per shape (bf16, B*N = 16k tokens, H*d = 2048): cuDNN's
forward, ours in fa3 mode, ours in gproj mode, and gproj's two pieces (key centering, lazy as in
the forward: random keys need no K'; the kernel alone on already centered keys), CUDA-event medians in one process, so the ratios travel.
Usage: python scripts/fwd_breakdown.py [d,N[,causal] ...]   (default: a small grid)"""
import sys

import torch
import torch.nn.functional as F

from gproj_cuda import _ext
from gproj_cuda.ops import _params, _rowstat_shape, center_keys_cuda, forward_cuda


def timed(fn, reps=30):
    for _ in range(3):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[reps // 2]


def kernel_only(q, kc, shift, v, n, s, wr):
    """The gproj forward kernel on keys centered beforehand (what forward_cuda launches last)."""
    rs = _rowstat_shape(q, False, q.shape[2])
    out = torch.empty_like(q)
    lse = torch.empty(rs, dtype=torch.float32, device=q.device)
    stats = torch.empty(rs + (2,), dtype=torch.float32, device=q.device)
    p = _params(q, kc, v, None, None, n, n, s, -1, wr, "gproj")
    p.out, p.o_stride = out.data_ptr(), [out.stride(0), out.stride(1), out.stride(2)]
    p.lse, p.stats, p.k_shift = lse.data_ptr(), stats.data_ptr(), shift.data_ptr()
    return lambda: _ext.extension().forward(p)


def main():
    args = sys.argv[1:] or ["64,2048", "64,16384", "128,2048", "128,2048,causal", "128,16384",
                            "256,2048", "256,16384"]
    print(f"{'d':>4} {'N':>6} {'causal':>6} | {'cuDNN':>7} {'fa3':>7} {'gproj':>7} | "
          f"{'center':>7} {'kernel':>7} | fa3/cuDNN gproj/cuDNN kernel/fa3")
    for a in args:
        f = a.split(",")
        d, n, causal = int(f[0]), int(f[1]), len(f) > 2
        B, H = max(1, 16384 // n), 2048 // d
        q, k, v = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        s, wr = d ** -0.5, (0 if causal else -1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        kc, shift = center_keys_cuda(k, None, n)
        t = {}
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            t["cudnn"] = timed(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        t["fa3"] = timed(lambda: forward_cuda(q, k, v, None, None, n, n, s, -1, wr, "fa3"))
        t["gproj"] = timed(lambda: forward_cuda(q, k, v, None, None, n, n, s, -1, wr, "gproj"))
        flags = torch.empty((B, H), dtype=torch.int32, device="cuda")
        t["center"] = timed(lambda: center_keys_cuda(k, None, n, flags=flags))  # lazy, as forward
        t["kernel"] = timed(kernel_only(q, kc, shift.contiguous(), v, n, s, wr))
        torch.cuda.synchronize()
        print(f"{d:4d} {n:6d} {str(causal):>6} | " +
              " ".join(f"{t[x]:7.3f}" for x in ("cudnn", "fa3", "gproj")) + " | " +
              " ".join(f"{t[x]:7.3f}" for x in ("center", "kernel")) +
              f" | {t['cudnn'] / t['fa3']:9.3f} {t['cudnn'] / t['gproj']:11.3f}"
              f" {t['fa3'] / t['kernel']:11.3f}")


if __name__ == "__main__":
    main()
