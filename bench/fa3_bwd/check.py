#!/usr/bin/env python3
"""Self-check for libfa3bwd.so on an H100/H200: correctness vs torch SDPA (math backend, fp32) and timing."""
import math
import torch
import torch.nn.functional as F
import fa3bwd


def ref_forward_backward(q, k, v, dout, causal, scale):
    """fp32 math-backend SDPA on (b, s, h, d) inputs; returns out(bf16), lse(b,h,s fp32), dq, dk, dv (fp32)."""
    qf, kf, vf = (t.detach().float().transpose(1, 2).requires_grad_(True) for t in (q, k, v))  # (b, h, s, d)
    hk, h = kf.shape[1], qf.shape[1]
    if hk != h:
        kf_, vf_ = kf.repeat_interleave(h // hk, 1), vf.repeat_interleave(h // hk, 1)
    else:
        kf_, vf_ = kf, vf
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        o = F.scaled_dot_product_attention(qf, kf_, vf_, is_causal=causal, scale=scale)
    o.backward(dout.float().transpose(1, 2))
    s = torch.matmul(qf.detach(), kf_.detach().transpose(-1, -2)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=s.device).tril(sk - sq)
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (b, h, sq)
    out = o.detach().transpose(1, 2).to(torch.bfloat16).contiguous()
    return out, lse.contiguous(), *(t.grad.transpose(1, 2) for t in (qf, kf, vf))


def rel_err(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()


def main():
    torch.manual_seed(0)
    dev = "cuda"
    hdims, gqa = fa3bwd.built_hdims()
    print("built hdims:", hdims, "gqa:", gqa)
    b, s, h = 2, 1000, 4
    for d, hk, causal in [(dd, hkk, c) for dd in hdims for hkk in (4, 2) for c in (False, True)]:
        scale = 1.0 / math.sqrt(d)
        q, dout = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, s, hk, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        out, lse, dq_ref, dk_ref, dv_ref = ref_forward_backward(q, k, v, dout, causal, scale)
        dq, dk, dv = fa3bwd.backward(q, k, v, out, dout, lse, causal, scale)
        torch.cuda.synchronize()
        print(f"d={d} hk={hk} causal={causal}: max rel err dq={rel_err(dq, dq_ref):.3e} dk={rel_err(dk, dk_ref):.3e} "
              f"dv={rel_err(dv, dv_ref):.3e}  (bf16 inputs; expect ~1e-2 or below)")

    # timing
    b, s, h, d = 4, 4096, 16, 128
    scale = 1.0 / math.sqrt(d)
    for causal in (False, True):
        q, k, v, dout, out = (torch.randn(b, s, h, d, device=dev, dtype=torch.bfloat16) for _ in range(5))
        lse = torch.randn(b, h, s, device=dev, dtype=torch.float32).abs() + math.log(s)  # plausible LSE values
        for _ in range(3):
            fa3bwd.backward(q, k, v, out, dout, lse, causal, scale)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 20
        start.record()
        for _ in range(n):
            fa3bwd.backward(q, k, v, out, dout, lse, causal, scale)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / n
        flops = 4 * 2.5 * b * h * s * s * d * (0.5 if causal else 1.0)  # fwd-equivalent 4*b*h*s*s*d, bwd = 2.5x
        print(f"b={b} s={s} h={h} d={d} causal={causal}: {ms:.3f} ms/call  ~{flops / ms / 1e9:.1f} TFLOP/s "
              f"(includes workspace allocation + preprocess/postprocess kernels)")


if __name__ == "__main__":
    main()
