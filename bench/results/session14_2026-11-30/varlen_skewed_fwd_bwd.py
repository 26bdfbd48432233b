"""Varlen forward + backward (one training step's attention) on length mixes: slot grids (default)
against the old grids (GPROJ_FWD_AB=4), interleaved (scripts/_timing.interleaved), d = 128,
H = 16, bf16, 16k tokens. Run from the repository root with PYTHONPATH=. ."""
import sys
sys.path.insert(0, "scripts")
sys.path.insert(0, "bench")
import torch
from _timing import interleaved
from speed import varlen_lengths
import gproj_cuda
H, d = 16, 128
mixes = {"mean 1k (speed.py)": list(varlen_lengths(16384, 1024)),
         "mean 4k (speed.py)": list(varlen_lengths(16384, 4096)),
         "8192 + 128 x 64": [8192] + [64] * 128,
         "4 x 2048 + 512 x 16": [2048] * 4 + [16] * 512,
         "2 x 6000 + 4384 x 1": [6000, 6000] + [1] * 4384}
print(f"{'mix':22s} {'mask':6s} | fwd+bwd ms: slots / old grid (ratio)")
for name, lens in mixes.items():
    offs = [0]
    for x in lens:
        offs.append(offs[-1] + x)
    cu = torch.tensor(offs, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(offs[-1], H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn(offs[-1], H, d, device="cuda", dtype=torch.bfloat16)
    mx = max(lens)
    for causal in (False, True):
        cands = []
        for m in ("fa3", "gproj"):
            def step(m=m):
                o = gproj_cuda.attention_varlen(q, k, v, cu, cu, mx, mx, causal=causal, numerics=m)
                o.backward(do)
            for ab in ("0", "4"):
                cands.append((f"{m} ab{ab}", ab, step))
        med = interleaved(cands, "GPROJ_FWD_AB", 8)
        print(f"{name:22s} {'causal' if causal else 'none':6s} | " + "   ".join(
            f"{m} {med[m + ' ab0']:.3f} / {med[m + ' ab4']:.3f} ({med[m + ' ab0'] / med[m + ' ab4']:.2f})"
            for m in ("fa3", "gproj")), flush=True)
