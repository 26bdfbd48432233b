"""One forward + backward of one shape, for Nsight Compute (scripts/ncu_round.sh): the kernels
under the profiler run once each after a warm-up, so `ncu -k regex:... -s 1 -c 1` catches a
steady-state launch. Usage: python scripts/ncu_case.py NUMERICS N [HDIM] [causal]
NUMERICS "upstream": FlashAttention-3's own forward (the `tokenspeed-fa3` wheel's
flash_attn_interface, forward only), for a side-by-side profile; "upstream_bwd": its forward, then
its backward from the standalone build in FA3_BWD_DIR (bench/fa3_bwd/README.md), fed by our fa3
mode's forward where the wheel is not importable. GPROJ_BWD_VARIANT picks our backward's form."""
import os
import sys

import torch

from gproj_cuda.ops import backward_cuda, forward_cuda


def main():
    numerics, n = sys.argv[1], int(sys.argv[2])
    d = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    causal = len(sys.argv) > 4 and sys.argv[4] == "causal"
    B, H = max(1, 16384 // n), 2048 // d  # B·N = 16k tokens, H·d = 2048 (bench/speed.py)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, n, H, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    s = d ** -0.5
    wr = 0 if causal else -1
    if numerics == "upstream":
        import flash_attn_interface
        for _ in range(2):
            out = flash_attn_interface.flash_attn_func(q, k, v, softmax_scale=s, causal=causal)
            out = out[0] if isinstance(out, tuple) else out
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), "non-finite output"
        print(f"upstream FA3 forward N={n} d={d} causal={causal}: ok")
        return
    if numerics == "upstream_bwd":
        from bwd_ab import fa3_forward_for_backward, load_fa3_backward
        fa3bwd = load_fa3_backward(os.environ["FA3_BWD_DIR"])
        out, lse = fa3_forward_for_backward(q, k, v, s, causal)
        for _ in range(2):
            dq, dk, dv = fa3bwd.backward(q, k, v, out, do, lse, causal, s)
        torch.cuda.synchronize()
        assert torch.isfinite(dq).all() and torch.isfinite(dk).all(), "non-finite gradients"
        print(f"upstream FA3 backward N={n} d={d} causal={causal}: ok")
        return
    for _ in range(2):  # warm-up launch, then the profiled one
        out, _, st = forward_cuda(q, k, v, None, None, n, n, s, -1, wr, numerics)
        dq, dk, dv = backward_cuda(do, q, k, v, out, st, None, None, n, n, s, -1, wr, numerics,
                                   hopper=True)
    torch.cuda.synchronize()
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all(), "non-finite gradients"
    print(f"{numerics} N={n} d={d} causal={causal}: ok")


if __name__ == "__main__":
    main()
