"""Error measures of SPEC.md section 5 and the stress-grid inputs they are measured on."""

from __future__ import annotations

import math

import torch


def row_rel_err(g: torch.Tensor, ref: torch.Tensor) -> float:
    """Median over rows (all axes but the last) of ||g_i - ref_i|| / ||ref_i||.

    Rows whose reference norm is 0 are excluded; any NaN/inf in ``g`` makes the error inf
    (NaN always fails). Returns 0.0 if no row has a nonzero reference.
    """
    g64 = g.detach().double().reshape(-1, g.shape[-1])
    r64 = ref.detach().double().reshape(-1, ref.shape[-1]).to(g64.device)
    if not torch.isfinite(g64).all():
        return math.inf
    rn = r64.norm(dim=-1)
    keep = rn > 0
    if not keep.any():
        return 0.0
    err = (g64[keep] - r64[keep]).norm(dim=-1) / rn[keep]
    return float(err.median())


def sum_dk_rel(dk: torch.Tensor, cu_seqlens_k=None) -> float:
    """max over (sequence, kv head) of |Σ_j dK_j| / Σ_j ||dK_j||: the keys' common gradient.

    Softmax makes every row of dS sum to zero, so Σ_j dK_j = α Σ_i (Σ_j dS_ij) q_i = 0 exactly;
    this measures how far the computed gradient is from that law. ``dk`` is (B, N, Hk, d) or,
    varlen, (T, Hk, d) with ``cu_seqlens_k``.
    """
    d64 = dk.detach().double()
    if not torch.isfinite(d64).all():
        return math.inf
    if cu_seqlens_k is None:
        segs = [d64[b] for b in range(d64.shape[0])]
    else:
        cu = cu_seqlens_k.tolist()
        segs = [d64[cu[b]:cu[b + 1]] for b in range(len(cu) - 1)]
    worst = 0.0
    for s in segs:
        if s.shape[0] == 0:
            continue
        num = s.sum(0).norm(dim=-1)            # (Hk,)
        den = s.norm(dim=-1).sum(0)            # (Hk,)
        ok = den > 0
        if ok.any():
            worst = max(worst, float((num[ok] / den[ok]).max()))
    return worst


def stress_inputs(batch, seqlen, heads, hdim, *, kmean=0.0, qmean=0.0, qscale=1.0,
                  dtype=torch.bfloat16, device="cpu", seed=0, heads_k=None, seqlen_k=None):
    """SPEC.md section 5 stress inputs, rounded to ``dtype``.

    q = qscale·N(0,1) + qmean·u and k = N(0,1) + kmean·w, with u and w fixed random ±1 vectors per
    head; v, dO ~ N(0,1). Layout (B, N, H, d). Generated in float32 on the CPU from ``seed`` so a
    grid point is the same on every machine, then moved to ``device``.
    """
    heads_k = heads if heads_k is None else heads_k
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    def signs(h):
        return torch.randint(0, 2, (h, hdim), generator=gen).float() * 2 - 1

    u, w = signs(heads), signs(heads_k)
    q = qscale * randn(batch, seqlen, heads, hdim) + qmean * u
    k = randn(batch, seqlen_k, heads_k, hdim) + kmean * w
    v = randn(batch, seqlen_k, heads_k, hdim)
    do = randn(batch, seqlen, heads, hdim)
    return tuple(t.to(dtype).to(device) for t in (q, k, v, do))
