"""Exact key centering: remove the keys' common offset before any score is accumulated.

Softmax is invariant to adding a constant to a row of scores, and a common key shift ``c`` adds
exactly ``q_i · c`` to every score of row ``i`` (whatever the mask). So attention computed with
``K' = K - c`` has the same probabilities, the same output and, once the score-gradient rows sum
to zero (GProj), the same gradients.

Why it matters numerically: the kernels accumulate ``S = Q Kᵀ`` in fp32. With a large key mean
(SPEC stress grid: kmean 1024, qscale 32) the partial sums reach ~2e6 and their fp32 rounding
moves ``p`` by ~0.3% per element; in FP16, whose inputs carry 3 more mantissa bits than BF16,
that alone puts the median dQ error at 0.5-0.6% (measured with the CPU emulator, N=1024, d=256).
With centered keys the partial sums are the size of the keys' spread and the error drops to 0.02%.

The shift is chosen per (sequence, kv head, coordinate) so that the subtraction is *exact* in the
input dtype, so ``K'`` is still the user's keys up to a constant, to the last bit: when every key's
coordinate lies in ``[c/2, 2c]`` (all of one sign), Sterbenz's lemma makes ``k - c`` exactly
representable; there we take ``c`` = the midpoint of the coordinate's range, rounded to the dtype.
Other coordinates (no dominant offset) get ``c = 0``.

The queries are centered too, but only inside the dK GEMM of the gproj backward (``query_shift``,
never for the scores), by another rule: their shift need not be exact, it must leave no offset.
dK_j = Σ_i A_ij q_i is computed as Σ_i A~_ij (q_i - c) + c Σ_i A_ij, with A~ = A rounded once;
the rounding leaves a residual in the column sums of A~ that multiplies whatever offset q - c
keeps. The exact rule cannot center an offset of a few standard deviations (N(0,1) + 6 reaches
below c/2 over a few hundred rows), and there the dK error reached 2x that of the exact forms
(bench/NOTES.md session 17). So a query coordinate is shifted by its rounded midpoint wherever
that exceeds an eighth of its range, and q - c is rounded where it is not exact: one rounding of
a centered value, the size of the other roundings. Zero-mean queries (the midpoint of N(0,1) over
2k rows has a standard deviation ~0.2, an eighth of the range ~0.8) keep ``c = 0``.
"""

from __future__ import annotations

import torch


def _segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    counts = cu_seqlens[1:] - cu_seqlens[:-1]
    nseq = counts.shape[0]
    return torch.repeat_interleave(torch.arange(nseq, device=cu_seqlens.device), counts.long(),
                                   output_size=total)


def key_shift(k: torch.Tensor, cu_seqlens_k: torch.Tensor | None = None,
              approx: bool = False) -> torch.Tensor:
    """Per-(sequence, head) shift ``c`` of shape (B, H, d), in k's dtype, exact to subtract
    (``approx=True``: the queries' rule, see ``query_shift``).

    Used for the keys (scores, dQ)."""
    kf = k.float()
    if cu_seqlens_k is None:
        lo = kf.amin(dim=1)
        hi = kf.amax(dim=1)
    else:
        nseq = cu_seqlens_k.shape[0] - 1
        seg = _segment_ids(cu_seqlens_k, k.shape[0])
        idx = seg.view(-1, 1, 1).expand_as(kf)
        shape = (nseq,) + tuple(k.shape[1:])
        lo = torch.full(shape, float("inf"), device=k.device).scatter_reduce(
            0, idx, kf, "amin", include_self=True)
        hi = torch.full(shape, float("-inf"), device=k.device).scatter_reduce(
            0, idx, kf, "amax", include_self=True)
    return shift_from_range(lo, hi, k.dtype, approx)


def query_shift(q: torch.Tensor, cu_seqlens_q: torch.Tensor | None = None) -> torch.Tensor:
    """The queries' shift inside the dK GEMM (B, H, d): the rounded midpoint of each coordinate
    wherever it exceeds an eighth of the coordinate's range, else 0; ``q - c`` rounded where it
    is not exact (the module docstring says why)."""
    return key_shift(q, cu_seqlens_q, approx=True)


def shift_from_range(lo: torch.Tensor, hi: torch.Tensor, dtype, approx: bool = False) -> torch.Tensor:
    """The shift from each coordinate's fp32 min and max over the keys (+inf/-inf: no keys).
    ``approx``: the queries' rule (``query_shift``), as csrc/prepost/center_keys.cuh.

    Split out so that sharded keys (context parallelism) get the single-device shift from a MIN
    and a MAX all-reduce of their local ranges."""
    seen = torch.isfinite(lo) & torch.isfinite(hi)   # an empty sequence has no keys: c = 0
    mid = ((lo + hi) * 0.5).to(dtype)
    if approx:
        midf = mid.float()
        shifted = seen & torch.isfinite(midf) & (midf.abs() > 0.125 * (hi - lo))
    else:
        positive = seen & (lo > 0) & (hi <= 2 * lo)
        negative = seen & (hi < 0) & (lo >= 2 * hi)
        shifted = positive | negative
    return torch.where(shifted, mid, torch.zeros_like(mid))


def center_keys(k: torch.Tensor, cu_seqlens_k: torch.Tensor | None = None):
    """Return ``(k - c, c)`` with ``c = key_shift(k)``; the subtraction is exact."""
    shift = key_shift(k, cu_seqlens_k)
    if cu_seqlens_k is None:
        kc = (k.float() - shift.float().unsqueeze(1)).to(k.dtype)
    else:
        seg = _segment_ids(cu_seqlens_k, k.shape[0])
        kc = (k.float() - shift.float()[seg]).to(k.dtype)
    return kc, shift
