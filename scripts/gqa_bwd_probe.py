"""Where fa3 mode's GQA backward loses against its dense backward (bench/results/speed.md: causal
GQA 0.90-0.92x cuDNN's time ratio against dense causal's 1.02-1.06x). For each shape (d = 128,
H = 16, H_k = 2), interleaved call by call: cuDNN GQA, fa3 mode on the GQA inputs, fa3 mode on
K and V expanded to 16 heads (the dense problem of the same FLOPs; its dK / dV sum over the group
is not included), gproj likewise. Then, with the torch profiler, each candidate's time per kernel.
Run on a GPU: python scripts/gqa_bwd_probe.py [d,N[,causal] ...]"""
import os
import sys

import torch
import torch.nn.functional as F
from _timing import Case, interleaved

from gproj_cuda.ops import backward_cuda, forward_cuda


def cands_for(c):
    n, s, wr = c.n, c.scale, c.window_right
    q, k, v = c.q, c.k, c.v
    g = c.H // c.Hk
    ke, ve = (t.repeat_interleave(g, dim=2).contiguous() for t in (k, v))
    do = torch.randn_like(q)
    ql, kl, vl = (x.detach().requires_grad_() for x in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ot = F.scaled_dot_product_attention(ql.transpose(1, 2), kl.transpose(1, 2),
                                            vl.transpose(1, 2), is_causal=c.causal,
                                            enable_gqa=True).transpose(1, 2)

    def cudnn_bwd():
        ql.grad = kl.grad = vl.grad = None
        ot.backward(do, retain_graph=True)
    cands = [("cudnn gqa", None, cudnn_bwd)]
    for m in ("fa3", "gproj"):
        for label, kk, vv in (("gqa", k, v), ("expanded", ke, ve)):
            out, _, st, ks = forward_cuda(q, kk, vv, None, None, n, n, s, -1, wr, m,
                                          return_k_shift=True)
            cands.append((f"{m} {label}", None,
                          lambda m=m, kk=kk, vv=vv, out=out, st=st, ks=ks: backward_cuda(
                              do, q, kk, vv, out, st, None, None, n, n, s, -1, wr, m,
                              hopper=True, k_shift=ks)))
    return cands


def per_kernel(fn, reps=5):
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows[e.key] = e.device_time_total / reps / 1e3
    return sorted(rows.items(), key=lambda kv: -kv[1])


def main():
    shapes = sys.argv[1:] or ["128,4096,causal,gqa", "128,16384,causal,gqa", "128,4096,gqa"]
    reps = int(os.environ.get("AB_REPS", "15"))
    for a in shapes:
        c = Case.parse(a if "gqa" in a else a + ",gqa")
        cands = cands_for(c)
        t = interleaved(cands, "GPROJ_BWD_VARIANT", reps)
        base = t["cudnn gqa"]
        print(f"\n== d={c.d} N={c.n} B={c.B} H={c.H} Hk={c.Hk} causal={c.causal}", flush=True)
        for name, ms in t.items():
            print(f"  {name:16} {ms:8.3f} ms  ({ms / base:5.3f}x cudnn gqa)", flush=True)
        for name, _, fn in cands[1:]:
            print(f"  -- kernels, {name}:")
            for k, ms in per_kernel(fn)[:6]:
                print(f"     {ms:8.3f} ms  {k[:110]}")


if __name__ == "__main__":
    main()
