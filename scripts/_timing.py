"""Shared by the scripts/*_breakdown.py and fwd_ab.py measurements: CUDA-event medians, and the
bench shapes (B·N = 16k tokens, H·d = 2048, bf16) from a "d,N[,causal]" argument."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def timed(fn, reps=20):
    """Median milliseconds of fn() over `reps` CUDA-event timings, after three warm-up calls."""
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


@dataclass
class Case:
    """One forward problem: random bf16 q, k, v of shape (B, N, H, d)."""
    d: int
    n: int
    causal: bool

    def __post_init__(self):
        self.B, self.H = max(1, 16384 // self.n), 2048 // self.d
        self.q, self.k, self.v = (torch.randn(self.B, self.n, self.H, self.d, device="cuda",
                                              dtype=torch.bfloat16) for _ in range(3))
        self.scale, self.window_right = self.d ** -0.5, (0 if self.causal else -1)

    @classmethod
    def parse(cls, arg):
        f = arg.split(",")
        return cls(int(f[0]), int(f[1]), len(f) > 2)

    def cudnn(self):
        """cuDNN's forward (torch SDPA) on the same tensors."""
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=self.causal)
