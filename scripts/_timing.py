"""Shared by the scripts/*_breakdown.py and *_ab.py measurements: CUDA-event medians, and the
bench shapes (B·N = 16k tokens, H·d = 2048, bf16) from a "d,N[,causal]" argument."""
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from speed import varlen_lengths  # noqa: E402  (bench/speed.py: the varlen shapes' lengths)


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
    """One forward problem: random bf16 q of shape (B, N, H, d), k and v of (B, N, H_k, d),
    H_k = H (or H / 8 with gqa, as bench/speed.py's GQA shapes). Varlen ("d,vM"): 16k tokens
    packed into sequences of mean length M drawn as bench/speed.py draws them (the same lengths),
    q of (total, H, d), cu_seqlens in `cu`, N the longest length. AB_KMEAN=x (environment): keys
    N(0,1) + x w, w a fixed random +-1 per (head, coordinate), the SPEC grid's key offset (the
    gproj centering then shifts every coordinate and writes K')."""
    d: int
    n: int
    causal: bool
    gqa: bool = False
    varlen_mean: int = 0

    def __post_init__(self):
        self.H = 2048 // self.d
        self.Hk = self.H // 8 if self.gqa else self.H
        self.cu = None
        if self.varlen_mean:
            lens = varlen_lengths(16384, self.varlen_mean)
            self.B, self.n = len(lens), max(lens)
            offsets = [0]
            for x in lens:
                offsets.append(offsets[-1] + x)
            self.cu = torch.tensor(offsets, dtype=torch.int32, device="cuda")
            mk = lambda h: torch.randn(offsets[-1], h, self.d, device="cuda", dtype=torch.bfloat16)
        else:
            self.B = max(1, 16384 // self.n)
            mk = lambda h: torch.randn(self.B, self.n, h, self.d, device="cuda", dtype=torch.bfloat16)
        self.q, self.k, self.v = mk(self.H), mk(self.Hk), mk(self.Hk)
        kmean = float(os.environ.get("AB_KMEAN", "0"))
        if kmean:  # keys with a common offset, as the SPEC's stress grid (kmean * a fixed +-1 w)
            g = torch.Generator(device="cuda").manual_seed(0)
            w = torch.randint(0, 2, (self.Hk, self.d), generator=g, device="cuda") * 2 - 1
            self.k = (self.k.float() + kmean * w).to(torch.bfloat16)
        self.scale, self.window_right = self.d ** -0.5, (0 if self.causal else -1)

    @classmethod
    def parse(cls, arg, varlen=False):
        """"d,N", "d,N,causal", "d,N,gqa" or "d,N,causal,gqa"; with varlen=True (the scripts
        that take them) also N = vM: varlen of mean M."""
        f = arg.split(",")
        if any(x not in ("causal", "gqa") for x in f[2:]):
            raise ValueError(f"shape {arg!r}: expected d,N[,causal][,gqa] (N = vM: varlen)")
        if f[1].startswith("v"):
            if not varlen:
                raise ValueError(f"shape {arg!r}: varlen shapes (d,vM) are taken by fwd_ab.py only")
            return cls(int(f[0]), 0, "causal" in f[2:], "gqa" in f[2:], int(f[1][1:]))
        return cls(int(f[0]), int(f[1]), "causal" in f[2:], "gqa" in f[2:])

    @property
    def mask(self):
        """The shape's label in the A/B tables: "none" or "causal", "gqa", "varlen"."""
        return (("causal" if self.causal else "none") + (" gqa" if self.gqa else "") +
                (" varlen" if self.cu is not None else ""))

    def forward_args(self):
        """q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k for gproj_cuda.ops.forward_cuda."""
        return self.q, self.k, self.v, self.cu, self.cu, self.n, self.n

    def cudnn(self):
        """cuDNN's forward (torch SDPA) on the same tensors (dense only)."""
        if self.cu is not None:
            raise ValueError("cuDNN's varlen forward (nested tensors) is not a useful baseline")
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=self.causal,
                                                  enable_gqa=self.gqa)

    def fa3(self):
        """FlashAttention-3's forward (flash_attn_interface, where importable) on the same
        tensors, or None."""
        try:
            import flash_attn_interface as fa
        except ImportError:
            return None
        if self.cu is not None:
            return lambda: fa.flash_attn_varlen_func(self.q, self.k, self.v, self.cu, self.cu,
                                                     self.n, self.n, causal=self.causal)
        return lambda: fa.flash_attn_func(self.q, self.k, self.v, causal=self.causal)


def interleaved(cands, env_var, reps):
    """Median milliseconds of each candidate (name, env value or None, fn), the candidates run
    call by call in turn for reps rounds after two warm-up rounds, so that clock and thermal drift
    hit all alike. A candidate's env value is put in os.environ[env_var] before each of its calls
    (the kernels read their variant switch at every call). The calls are queued back to back:
    the CPU stays ahead of the GPU, and each call's own events bracket its GPU work."""
    times = {name: [] for name, _, _ in cands}
    for r in range(reps + 2):
        evs = []
        # The round starts on an idle GPU (the synchronize below): without this sleep the first
        # candidate's events would bracket its host dispatch too, until the host gets ahead.
        # FlashAttention-3's forward measured 25-40% slower first in a round than alone
        # (bench/NOTES.md session 14), so the ratios to the first candidate (cuDNN) were biased
        # in our favour until then. ~2 ms keeps the GPU busy while the host queues the round.
        torch.cuda._sleep(4_000_000)
        for name, var, fn in cands:
            if var is not None:
                os.environ[env_var] = var
            a_ev, b_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a_ev.record()
            fn()
            b_ev.record()
            evs.append((name, a_ev, b_ev))
        torch.cuda.synchronize()
        if r >= 2:
            for name, a_ev, b_ev in evs:
                times[name].append(a_ev.elapsed_time(b_ev))
    return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def with_library(path):
    """A wrapper that runs a function with another build of the extension (a .so file, e.g. the
    previous commit's) in place of gproj_cuda._C, for A/B runs of two builds in one process
    (scripts/fwd_ab.py and bwd_ab.py, AB_LIB=path)."""
    import importlib.machinery
    import importlib.util

    from gproj_cuda import _ext
    loader = importlib.machinery.ExtensionFileLoader("_C", path)
    spec = importlib.util.spec_from_file_location("_C", path, loader=loader)
    alt = importlib.util.module_from_spec(spec)
    loader.exec_module(alt)

    def wrap(fn):
        def run(*a, **kw):
            own, _ext._C = _ext._C, alt
            try:
                return fn(*a, **kw)
            finally:
                _ext._C = own
        return run
    return wrap
