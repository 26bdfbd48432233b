"""Varlen forward on skewed length mixes: slots (default) against the old grid (GPROJ_FWD_AB=4),
interleaved (scripts/_timing.interleaved), d = 128, H = 16, bf16. Run from the repository root."""
import sys
sys.path.insert(0, "scripts")
import torch
from _timing import interleaved
from gproj_cuda.ops import forward_cuda
H, d = 16, 128
mixes = {"8192 + 128 x 64": [8192] + [64] * 128,
         "4 x 2048 + 512 x 16": [2048] * 4 + [16] * 512,
         "1 x 16384": [16384],
         "2 x 6000 + 4384 x 1": [6000, 6000] + [1] * 4384}
for name, lens in mixes.items():
    offs = [0]
    for x in lens:
        offs.append(offs[-1] + x)
    cu = torch.tensor(offs, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(offs[-1], H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mx = max(lens)
    for causal in (False, True):
        cands = []
        for m in ("fa3", "gproj"):
            for ab in ("0", "4"):
                cands.append((f"{m} ab{ab}", ab, lambda m=m: forward_cuda(
                    q, k, v, cu, cu, mx, mx, d ** -0.5, -1, 0 if causal else -1, m)))
        med = interleaved(cands, "GPROJ_FWD_AB", 10)
        print(f"{name:22s} {'causal' if causal else 'none':6s} " +
              "  ".join(f"{n} {t:.3f}" for n, t in med.items()), flush=True)
