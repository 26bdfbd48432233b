"""Float64 reference attention and a CPU emulation of the kernels' arithmetic.

Two things live here, both pure PyTorch (CPU or GPU tensors, no extension needed):

* ``attention`` / ``attention_grads``: exact attention and its exact gradients in float64 on the
  given (already BF16/FP16-rounded) inputs. This is the yardstick every accuracy number is measured
  against.
* ``emulate`` (and its halves ``emulate_forward`` / ``emulate_backward``): the kernels' arithmetic
  step by step, with the same roundings in the same places, in both numerics modes:

  - ``"fa3"``: FlashAttention-3's arithmetic. ``p = exp2(fma(s, c, -max*c))`` with ``c = scale*log2(e)``
    (one rounding, so the largest score gets ``exp2(residual)``, not ``exp2(0)``); BF16 ``P`` in
    ``P·V``; backward recomputes ``p = exp2(fma(s, c, -lse_log2))``, ``delta = rowsum(dO ∘ O)``
    from the BF16 output, ``dS`` cast to BF16 and fed to the GEMMs as is.
  - ``"gproj"``: exact-max forward and the GProj backward epilogue (SPEC.md section 3).

Layouts are those of the public API: dense ``q (B, Nq, H, d)``, ``k, v (B, Nk, Hk, d)``, or varlen
``q (Tq, H, d)`` with ``cu_seqlens``. ``lse`` is ``(B, H, Nq)`` (varlen: ``(H, Tq)``), natural log,
``+inf`` for rows that see no key. ``stats`` (emulator only) is the kernels' internal per-row
softmax state ``[raw score max, log2(row sum)]``, shape ``lse.shape + (2,)``.
"""

from __future__ import annotations

import math
from typing import Iterator, Optional

import torch

from .centering import center_keys, query_shift
from .masks import normalize_window, visible

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NUMERICS = ("gproj", "fa3")

# Score-matrix elements materialized at once (per chunk of heads); bounds host memory.
_CHUNK_ELEMS = 1 << 24


# --------------------------------------------------------------------------------------------
# Layout plumbing shared by the reference and the emulator
# --------------------------------------------------------------------------------------------

def _segments(q, k, cu_seqlens_q, cu_seqlens_k) -> Iterator[tuple[int, slice, slice]]:
    """Yield ``(batch_index, q_rows, k_rows)``: per sequence, the rows of q and k it owns.

    Dense tensors are (B, N, H, d): the rows are the whole N axis of batch b. Varlen tensors are
    (T, H, d): the rows are ``cu_seqlens[b]:cu_seqlens[b+1]``.
    """
    if cu_seqlens_q is None:
        for b in range(q.shape[0]):
            yield b, slice(0, q.shape[1]), slice(0, k.shape[1])
    else:
        cq = cu_seqlens_q.tolist()
        ck = cu_seqlens_k.tolist()
        for b in range(len(cq) - 1):
            yield b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])


def _take(x, b, rows, varlen):
    """Rows of sequence b as (H, n, d)."""
    seg = x[rows] if varlen else x[b, rows]
    return seg.transpose(0, 1)


def _put(dst, b, rows, varlen, val):
    """Inverse of ``_take``: write (H, n, d) back into the layout."""
    if varlen:
        dst[rows] = val.transpose(0, 1)
    else:
        dst[b, rows] = val.transpose(0, 1)


def _put_rowstat(dst, b, rows, varlen, val):
    """Write a per-row (H, n, ...) statistic into lse/stats layout (B, H, N, ...) or (H, T, ...)."""
    if varlen:
        dst[:, rows] = val
    else:
        dst[b, :, rows] = val


def _get_rowstat(src, b, rows, varlen):
    return src[:, rows] if varlen else src[b, :, rows]


def _kv_chunks(hk: int, group: int, nq: int, nk: int) -> Iterator[slice]:
    """Chunks of kv heads so that one chunk's score matrices stay under ``_CHUNK_ELEMS``."""
    per_kv = max(1, group * max(nq, 1) * max(nk, 1))
    step = max(1, _CHUNK_ELEMS // per_kv)
    for start in range(0, hk, step):
        yield slice(start, min(hk, start + step))


def _check_common(q, k, v, cu_seqlens_q, cu_seqlens_k):
    varlen = cu_seqlens_q is not None
    if (cu_seqlens_k is None) != (not varlen):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    want = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != want:
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    h, hk = q.shape[-2], k.shape[-2]
    if h % hk:
        raise ValueError(f"heads ({h}) must be a multiple of heads_k ({hk})")
    return varlen, h, hk


def default_scale(d: int, softmax_scale: Optional[float]) -> float:
    return 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)


# --------------------------------------------------------------------------------------------
# Float64 reference
# --------------------------------------------------------------------------------------------

def attention_grads(q, k, v, do=None, *, causal=False, softmax_scale=None, window_size=(-1, -1),
                    cu_seqlens_q=None, cu_seqlens_k=None, compute_dtype=torch.float64):
    """Exact attention (float64) and, if ``do`` is given, exact gradients.

    Returns ``(out, lse, dq, dk, dv)`` in ``compute_dtype`` (the gradients are None without
    ``do``). ``compute_dtype=torch.float32`` gives "FP32 attention" (inputs upcast, all math in
    fp32), the baseline the numerics study compares against.
    """
    varlen, h, hk = _check_common(q, k, v, cu_seqlens_q, cu_seqlens_k)
    g = h // hk
    scale = default_scale(q.shape[-1], softmax_scale)
    left, right = normalize_window(causal, window_size)
    f64 = dict(dtype=compute_dtype, device=q.device)
    out = torch.zeros(q.shape, **f64)
    lse_shape = (h, q.shape[0]) if varlen else (q.shape[0], h, q.shape[1])
    lse = torch.full(lse_shape, math.inf, **f64)
    dq = torch.zeros(q.shape, **f64) if do is not None else None
    dk = torch.zeros(k.shape, **f64) if do is not None else None
    dv = torch.zeros(v.shape, **f64) if do is not None else None

    for b, qr, kr in _segments(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = (_take(t, b, r, varlen).to(compute_dtype) for t, r in ((q, qr), (k, kr), (v, kr)))
        nq, nk = qs.shape[1], ks.shape[1]
        if nq == 0 or nk == 0:   # no query, or no key to see: out 0, lse +inf, grads 0
            continue
        keep = visible(nq, nk, left, right, q.device)
        dos = _take(do, b, qr, varlen).to(compute_dtype) if do is not None else None
        o_seg = torch.zeros_like(qs)
        lse_seg = torch.full((h, nq), math.inf, **f64)
        dq_seg = torch.zeros_like(qs)
        dk_seg = torch.zeros_like(ks)
        dv_seg = torch.zeros_like(vs)
        for kc in _kv_chunks(hk, g, nq, nk):
            hc = slice(kc.start * g, kc.stop * g)
            qh = qs[hc]
            kh = ks[kc].repeat_interleave(g, 0)
            vh = vs[kc].repeat_interleave(g, 0)
            s = scale * (qh @ kh.transpose(-1, -2))
            s = s.masked_fill(~keep, -math.inf)
            m = s.amax(-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            p = torch.exp(s - m)
            l = p.sum(-1, keepdim=True)
            p = p / torch.where(l > 0, l, torch.ones_like(l))
            o_seg[hc] = p @ vh
            lse_seg[hc] = torch.where(l[..., 0] > 0, (m + torch.log(l))[..., 0],
                                      torch.full_like(l[..., 0], math.inf))
            if dos is not None:
                doh = dos[hc]
                dp = doh @ vh.transpose(-1, -2)
                delta = (p * dp).sum(-1, keepdim=True)
                ds = p * (dp - delta)
                dq_seg[hc] = scale * (ds @ kh)
                dkh = scale * (ds.transpose(-1, -2) @ qh)
                dvh = p.transpose(-1, -2) @ doh
                dk_seg[kc] = dkh.unflatten(0, (-1, g)).sum(1)
                dv_seg[kc] = dvh.unflatten(0, (-1, g)).sum(1)
        _put(out, b, qr, varlen, o_seg)
        _put_rowstat(lse, b, qr, varlen, lse_seg)
        if do is not None:
            _put(dq, b, qr, varlen, dq_seg)
            _put(dk, b, kr, varlen, dk_seg)
            _put(dv, b, kr, varlen, dv_seg)
    return out, lse, dq, dk, dv


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False):
    """Exact float64 attention output (and natural-log LSE with ``return_lse``)."""
    out, lse, *_ = attention_grads(q, k, v, None, causal=causal, softmax_scale=softmax_scale,
                                   window_size=window_size, cu_seqlens_q=cu_seqlens_q,
                                   cu_seqlens_k=cu_seqlens_k)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------
# CPU emulation of the kernels' arithmetic
# --------------------------------------------------------------------------------------------

def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def _fma(a, b, c):
    """fp32 fused multiply-add: exact a*b + c, rounded once to fp32.

    The product of two fp32 values is exact in float64 (48 significant bits), so one float64
    multiply-add followed by a rounding to fp32 is the fused operation up to a double-rounding
    tie that cannot change anything measured here.
    """
    return (a.double() * b.double() + c.double()).float()


def _scale_log2(scale: float) -> torch.Tensor:
    # The kernels form c = scale * log2(e) as an fp32 product of two fp32 constants.
    return _f32(scale) * _f32(LOG2E)


def _forward_probs(s, m, c, numerics):
    """Unnormalized probabilities of the forward pass for raw fp32 scores ``s`` and row max ``m``.

    gproj: the raw max is subtracted first (exact for the maximal element; for every element the
           rounding is relative to the *difference*, not to the possibly huge score), then scaled:
           the maximal element gets exactly exp2(0) = 1.
    fa3:   one fused multiply-add against the rounded scaled max; for the maximal element the
           exponent is the rounding residual of m*c, i.e. up to half an ulp of a large number.
    """
    if numerics == "gproj":
        return torch.exp2((s - m) * c)
    return torch.exp2(_fma(s, c, -(m * c)))


def _backward_probs(s, m, log2l, c, numerics):
    """Normalized probabilities recomputed in the backward pass from the saved row statistics."""
    if numerics == "gproj":
        return torch.exp2(_fma(s - m, c, -log2l))
    lse_log2 = m * c + log2l  # FA3 keeps one fp32 log-sum-exp per row
    return torch.exp2(_fma(s, c, -lse_log2))


def _grad_gemm_dtype(dtype, numerics):
    """Operand type of the gradient GEMMs (dQ = dS~ K, dK = dS~ᵀ Q, dV = P~ᵀ dO, corrections).

    FP16 has 5 exponent bits. On the stress grid (qmean 16) the probabilities and score
    gradients of most keys are far below FP16's normal range (p ~ 2^-58): rounded to FP16 they
    flush to zero, and dK/dV of most keys lose every bit (median error 100%), while dQ rows of
    very sharp attention lose their small terms (17% at d=128; emulator, N=192). In gproj mode
    the gradient GEMMs therefore take BF16 operands for FP16 inputs too (P~, dS~ and BF16 copies
    of Q, dO and the centered K). Centering is what makes the BF16 copy of K harmless: it rounds
    the keys' spread, not their mean. S and dP still come from the FP16 inputs, so P is exactly
    the forward's. ``fa3`` mode keeps FA3's arithmetic in the input type.
    """
    return torch.bfloat16 if numerics == "gproj" else dtype


def _expand_kv(x, g):
    return x.repeat_interleave(g, 0)


def _forward_chunk(qs, ks, vs, keep, c, numerics, dtype, out_dtype=None):
    """Forward arithmetic of one (query chunk, key chunk) pair of one sequence.

    ``qs`` (H, nq, d), ``ks``/``vs`` (Hk, nk, d) as fp32 copies of the input-dtype values (keys
    already centered in gproj mode), ``keep`` the (nq, nk) mask. Returns ``out`` (H, nq, d) in
    ``out_dtype`` (default ``dtype``; BF16 P in P·V is in ``dtype`` either way) and ``stats``
    (H, nq, 2): [raw score max, log2 row sum], (+inf, 0) for a row that sees no key.
    """
    out_dtype = dtype if out_dtype is None else out_dtype
    h, hk = qs.shape[0], ks.shape[0]
    g = h // hk
    nq, nk = qs.shape[1], ks.shape[1]
    o_seg = torch.zeros(h, nq, qs.shape[-1], dtype=out_dtype, device=qs.device)
    st_seg = torch.zeros(h, nq, 2, dtype=torch.float32, device=qs.device)
    st_seg[..., 0] = math.inf
    if nq == 0 or nk == 0:
        return o_seg, st_seg
    for kc in _kv_chunks(hk, g, nq, nk):
        hc = slice(kc.start * g, kc.stop * g)
        s = qs[hc] @ _expand_kv(ks[kc], g).transpose(-1, -2)       # fp32 accumulation
        s = s.masked_fill(~keep, -math.inf)
        m = s.amax(-1, keepdim=True)
        empty = m == -math.inf
        m_safe = torch.where(empty, torch.zeros_like(m), m)
        p = _forward_probs(s, m_safe, c, numerics)
        p = p.masked_fill(~keep, 0.0)
        l = p.sum(-1, keepdim=True)                                  # fp32 sum of fp32 p
        pv = p.to(dtype).float() @ _expand_kv(vs[kc], g)             # BF16 P in P·V
        inv_l = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
        o_seg[hc] = (pv * inv_l).to(out_dtype)
        st_seg[hc, :, 0] = torch.where(empty, torch.full_like(m, math.inf), m)[..., 0]
        st_seg[hc, :, 1] = torch.where(empty, torch.zeros_like(l), torch.log2(l))[..., 0]
    return o_seg, st_seg


def emulate_forward(q, k, v, *, numerics="gproj", causal=False, softmax_scale=None,
                    window_size=(-1, -1), cu_seqlens_q=None, cu_seqlens_k=None):
    """The forward kernel's arithmetic. Returns ``(out, lse, stats)``.

    ``out`` has q's dtype, ``lse`` is fp32 natural log, ``stats[..., 0]`` the raw (unscaled) score
    max and ``stats[..., 1]`` log2 of the row sum of unnormalized probabilities; rows that see no
    key get ``stats = (+inf, 0)`` so that the backward recomputes p = 0 for them. In gproj mode
    the scores are those of the centered keys (``centering.py``); ``lse`` is of the user's keys.
    """
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    varlen, h, hk = _check_common(q, k, v, cu_seqlens_q, cu_seqlens_k)
    g = h // hk
    scale = default_scale(q.shape[-1], softmax_scale)
    c = _scale_log2(scale)
    left, right = normalize_window(causal, window_size)
    out = torch.zeros_like(q)
    lse_shape = (h, q.shape[0]) if varlen else (q.shape[0], h, q.shape[1])
    lse = torch.full(lse_shape, math.inf, dtype=torch.float32, device=q.device)
    stats = torch.zeros(lse_shape + (2,), dtype=torch.float32, device=q.device)
    stats[..., 0] = math.inf
    shift = None
    if numerics == "gproj":
        k, shift = center_keys(k, cu_seqlens_k)

    for b, qr, kr in _segments(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = (_take(t, b, r, varlen).float() for t, r in ((q, qr), (k, kr), (v, kr)))
        nq, nk = qs.shape[1], ks.shape[1]
        if nq == 0 or nk == 0:   # out 0, lse +inf, stats (+inf, 0) as initialized
            continue
        keep = visible(nq, nk, left, right, q.device)
        o_seg, st_seg = _forward_chunk(qs, ks, vs, keep, c, numerics, q.dtype)
        _put(out, b, qr, varlen, o_seg)
        _put_rowstat(stats, b, qr, varlen, st_seg)
        lse_seg = stats_to_lse(st_seg, scale)
        if shift is not None:
            # Scores were taken against centered keys: add back alpha * (q_i . c), in fp32.
            qc = (qs * _expand_kv(shift[b].float(), g).unsqueeze(1)).sum(-1)
            lse_seg = lse_seg + _f32(scale) * qc
        _put_rowstat(lse, b, qr, varlen, lse_seg)
    return out, lse, stats


def stats_to_lse(stats: torch.Tensor, scale: float) -> torch.Tensor:
    """Natural-log LSE from the kernels' row statistics (fp32, as the kernels compute it)."""
    m, log2l = stats[..., 0], stats[..., 1]
    c = _scale_log2(scale).to(stats.device)
    lse = (m * c + log2l) * _f32(LN2).to(stats.device)
    return torch.where(torch.isinf(m) & (m > 0), torch.full_like(lse, math.inf), lse)


def _grads(qh, kh, vh, doh, st, delta, keep, c, numerics):
    """Both backward passes recompute the same tiles: fp32 ``(dS, P)`` (masked entries 0)."""
    s = (qh @ kh.transpose(-1, -2)).masked_fill(~keep, -math.inf)
    p = _backward_probs(s, st[..., 0:1], st[..., 1:2], c, numerics)
    p = p.masked_fill(~keep, 0.0)
    dp = doh @ vh.transpose(-1, -2)
    return p * (dp - delta), p


def _rounded_grads(qh, kh, vh, doh, st, delta, keep, c, gt, numerics):
    """``(dS~, P~)``: fp32 copies of the values in type ``gt`` that the gradient GEMMs consume."""
    ds, p = _grads(qh, kh, vh, doh, st, delta, keep, c, numerics)
    return ds.to(gt).float(), p.to(gt).float()


def _dq_chunk(qs, ks, vs, dos, st, delta, keep, c, gt, numerics):
    """Backward pass 1 (Q-outer) for one key chunk: unscaled fp32 ``dS~ K`` and, in gproj mode,
    ``P~ K`` and the row sums ``r = Σ_j dS~_ij``, ``s = Σ_j P~_ij`` (else None).

    lambda_i = r_i / s_i over exactly the values the GEMMs consume; the correction is a separate
    GEMM combined in fp32, never re-rounded through dS~ - lambda P~ (SPEC.md section 3). With
    several key chunks (context parallelism) the four sums simply add up over the chunks.
    """
    h, hk = qs.shape[0], ks.shape[0]
    g = h // hk
    dsk = torch.zeros_like(qs)
    gproj = numerics == "gproj"
    pk = torch.zeros_like(qs) if gproj else None
    r = torch.zeros(h, qs.shape[1], 1, dtype=torch.float64, device=qs.device) if gproj else None
    s = torch.zeros_like(r) if gproj else None
    for kc in _kv_chunks(hk, g, qs.shape[1], ks.shape[1]):
        hc = slice(kc.start * g, kc.stop * g)
        kh, vh = _expand_kv(ks[kc], g), _expand_kv(vs[kc], g)
        ds_t, p_t = _rounded_grads(qs[hc], kh, vh, dos[hc], st[hc], delta[hc], keep, c, gt,
                                   numerics)
        k_g = kh.to(gt).float()
        dsk[hc] = ds_t @ k_g
        if gproj:
            pk[hc] = p_t @ k_g
            # fp64 row sums (the kernel: fp32 within a key tile, fp64 across tiles). lambda must
            # remove a leak up to ~100x Σ_j |dK_j| to 1e-5 of it; fp32 sums over a whole row,
            # whose partial sums dwarf r, left 1e-5..3e-5 on one stress point.
            r[hc] = ds_t.double().sum(-1, keepdim=True)
            s[hc] = p_t.double().sum(-1, keepdim=True)
    return dsk, pk, r, s


def _lambda(r, s):
    """lambda_i = r_i / s_i from fp64 sums (0 where s_i = 0), as two fp32 parts ``(hi, lo)``:
    hi corrects dQ; A = dS~ - lambda P~ in the dK pass uses both (one fp32 lambda leaves up to
    7e-6 of Σ_j |dK_j| in Σ_j dK_j where the removed leak is 100x dK)."""
    r, s = r.double(), s.double()
    lam = torch.where(s > 0, r / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(r))
    hi = lam.float()
    return hi, (lam - hi.double()).float()


def _dkdv_chunk(qs, ks, vs, dos, st, delta, lam, q_shift, keep, c, gt, alpha, numerics,
                a_parts=3, dq_from_a=False):
    """Backward pass 2 (KV-outer) for one query chunk: fp32 ``(dK, dV, A~ K)`` of the chunk's
    keys, dK scaled by alpha, summed over the query heads of each kv head (GQA); ``A~ K`` (gproj
    with ``dq_from_a``, unscaled, per query head: the one-part dQ; else None). ``lam`` is ``(hi,
    lo)`` from ``_lambda`` (gproj); ``a_parts``, ``dq_from_a``: see ``emulate_backward``."""
    h, hk = qs.shape[0], ks.shape[0]
    g = h // hk
    dk = torch.zeros_like(ks)
    dv = torch.zeros_like(vs)
    dq_a = torch.zeros_like(qs) if numerics == "gproj" and dq_from_a else None
    for kc in _kv_chunks(hk, g, qs.shape[1], ks.shape[1]):
        hc = slice(kc.start * g, kc.stop * g)
        qh, doh = qs[hc], dos[hc]
        kh, vh = _expand_kv(ks[kc], g), _expand_kv(vs[kc], g)
        ds32, p32 = _grads(qh, kh, vh, doh, st[hc], delta[hc], keep, c, numerics)
        ds_t, p_t = ds32.to(gt).float(), p32.to(gt).float()
        if numerics == "gproj":
            # dK = α Aᵀ Q with A = dS~ - λ P~ formed in fp32 (rows sum to zero to fp32
            # rounding) and fed to the tensor cores as three rounded parts
            # A = A_hi + A_mid + A_lo (~24 bits), so the keys' common gradient vanishes to
            # ~2^-25 of |A||Q|. Measured alternatives (emulator, stress grid): the SPEC's
            # P~ᵀ bf16(λ∘Q) leaves 2^-9 of the removed leak (Σ dK residual up to 3e-3);
            # a hi/lo split of λ∘Q leaves 2^-17 of it (6e-2 when FP16 rows are so sharp
            # that the leak dwarfs dK); a two-part split of A leaves 2^-17 of |A||Q|
            # (1.5e-5 with a large query mean). All miss the 1e-5 bar somewhere. With the
            # centered queries and the fp64 rank-one below, two parts of A do meet it
            # (a_parts=2, "2a" in bench/NOTES.md: worst 1.4e-6 here, 1.6e-6 on the H200),
            # with the colsum taken of the fp32 A itself. One part (a_parts=1, the Hopper
            # backward's form) leaves each dK_j as accurate (the rounding is unbiased) but
            # up to 5e-4 in Σ_j dK_j, which project_key_sum then removes (NOTES.md session 7).
            # One part (the Hopper backward with two consumer warpgroups; with three, at d=64,
            # it forms A from the rounded values as the other forms do) takes A from the fp32 dS
            # and P: its rows no longer sum to zero exactly either way, and the projection below
            # restores Σ_j dK_j (SPEC grid: the same worst dK errors from either, NOTES.md).
            pa, dsa = (p32, ds32) if a_parts == 1 else (p_t, ds_t)
            a = _fma(-lam[1][hc], pa, _fma(-lam[0][hc], pa, dsa))
            a_hi = a.to(gt).float()
            r1 = a - a_hi
            if a_parts == 1:
                a_mid = a_lo = torch.zeros_like(a)
            elif a_parts == 2:
                a_mid = torch.zeros_like(a)
                a_lo = r1.to(gt).float()
            else:
                a_mid = r1.to(gt).float()
                a_lo = (r1 - a_mid).to(gt).float()
            # The GEMM takes exactly centered queries q' = q - c_q, and the common part
            # returns as the rank-one c_q (x) colsum(A) in fp32: the tensor cores' fp32
            # accumulation (truncating, on Hopper) is then relative to the queries'
            # spread, not to a large query mean (one stress point reached a Σ_j dK_j
            # residual of 3e-5 on the H200 without this).
            qc_g = (qh - q_shift[hc].unsqueeze(1)).to(gt).float()
            # colsum in fp64: it is multiplied by the (large) query mean.
            if a_parts in (1, 2):
                colsum = a.double().sum(-2)
            else:
                colsum = (a_hi.double() + a_mid.double() + a_lo.double()).sum(-2)
            rank1 = (colsum.unsqueeze(-1) * q_shift[hc].double().unsqueeze(1)).float()
            dk_acc = a_hi.transpose(-1, -2) @ qc_g + a_lo.transpose(-1, -2) @ qc_g + rank1
            if a_parts != 2:
                dk_acc = dk_acc + a_mid.transpose(-1, -2) @ qc_g
            if dq_a is not None:
                dq_a[hc] = a_hi @ kh.to(gt).float()  # (kh: the centered keys)
        else:
            dk_acc = ds_t.transpose(-1, -2) @ qh.to(gt).float()
        dv_acc = p_t.transpose(-1, -2) @ doh.to(gt).float()
        dk[kc] = (alpha * dk_acc).unflatten(0, (-1, g)).sum(1)
        dv[kc] = dv_acc.unflatten(0, (-1, g)).sum(1)
    return dk, dv, dq_a


def project_key_sum(dk: torch.Tensor) -> torch.Tensor:
    """The zero-sum projection of the one-part dK (``a_parts=1``, csrc/prepost/dk_project.cuh):
    dK_j - w_j Σ_k dK_k with w_j = ||dK_j|| / Σ_k ||dK_k||, per kv head. ``dk``: fp32 (kv heads,
    keys, d), one sequence. Weights that follow each key's own gradient leave a key that no
    query sees at its exact 0 and move every key by the same fraction of its norm; uniform
    weights failed the per-key bar (a key with a tiny gradient received the whole mean). The
    sums in fp64, as the kernels'."""
    norms = dk.float().norm(dim=-1, keepdim=True).double()
    total = norms.sum(1, keepdim=True)
    w = torch.where(total > 0, norms / torch.where(total > 0, total, torch.ones_like(total)),
                    torch.zeros_like(norms))
    return (dk.double() - w * dk.double().sum(1, keepdim=True)).float()


def emulate_backward(do, q, k, v, out, stats, *, numerics="gproj", causal=False,
                     softmax_scale=None, window_size=(-1, -1), cu_seqlens_q=None,
                     cu_seqlens_k=None, fp32_grads=False, a_parts=3, dq_from_a=False):
    """The backward kernels' arithmetic. Returns ``(dq, dk, dv)``.

    In the input dtype, or in fp32 with ``fp32_grads=True`` (the values before the final store,
    which is where the SPEC's Σ_j dK_j bar is measured). ``a_parts`` (gproj): A = dS~ - λP~
    enters the dK GEMM as 3 rounded parts (the mma.sync passes), 2 (GPROJ_BWD_VARIANT=6) or 1
    followed by ``project_key_sum`` (the Hopper backward, the default on sm_90, bf16);
    the kernels' fp32 summation orders are not modelled. ``dq_from_a`` (gproj, ``a_parts=1``;
    a study, not a kernel's form): dQ = α A~ K' from the same rounded A as dK, instead of SPEC
    section 3's α (dS~ K' - λ P~ K') from two GEMMs combined in fp32. Measured and rejected
    (bench/NOTES.md session 17): where a key offset escapes the exact centering it leaks.
    """
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    if a_parts not in (1, 2, 3):
        raise ValueError(f"a_parts must be 1, 2 or 3, got {a_parts!r}")
    if dq_from_a and a_parts != 1:
        raise ValueError(f"dq_from_a needs a_parts=1 (one rounded A for dQ and dK), got {a_parts!r}")
    varlen, h, hk = _check_common(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = default_scale(q.shape[-1], softmax_scale)
    c = _scale_log2(scale)
    alpha = _f32(scale)
    left, right = normalize_window(causal, window_size)
    gdt = torch.float32 if fp32_grads else q.dtype
    dq = torch.zeros(q.shape, dtype=gdt, device=q.device)
    dk = torch.zeros(k.shape, dtype=gdt, device=q.device)
    dv = torch.zeros(v.shape, dtype=gdt, device=q.device)
    if numerics == "gproj":
        k, _ = center_keys(k, cu_seqlens_k)   # the same exact shift as the forward
        q_shifts = query_shift(q, cu_seqlens_q).float()   # for the dK GEMM (see _dkdv_chunk)
    gt = _grad_gemm_dtype(q.dtype, numerics)

    for b, qr, kr in _segments(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = (_take(t, b, r, varlen).float() for t, r in ((q, qr), (k, kr), (v, kr)))
        dos = _take(do, b, qr, varlen).float()
        st = _get_rowstat(stats, b, qr, varlen)
        nq, nk = qs.shape[1], ks.shape[1]
        dq_seg = torch.zeros(h, nq, q.shape[-1], dtype=torch.float32, device=q.device)
        dk_seg = torch.zeros(hk, nk, k.shape[-1], dtype=torch.float32, device=q.device)
        dv_seg = torch.zeros(hk, nk, v.shape[-1], dtype=torch.float32, device=q.device)
        if nq > 0 and nk > 0:
            keep = visible(nq, nk, left, right, q.device)
            # delta_i = sum_d dO_id * O_id from the output as stored (both modes).
            delta = (dos * _take(out, b, qr, varlen).float()).sum(-1, keepdim=True)
            dsk, pk, r, s = _dq_chunk(qs, ks, vs, dos, st, delta, keep, c, gt, numerics)
            lam = _lambda(r, s) if numerics == "gproj" else None
            dq_seg = alpha * (dsk - lam[0] * pk if lam is not None else dsk)
            q_shift = q_shifts[b] if numerics == "gproj" else None
            dk_seg, dv_seg, dq_a = _dkdv_chunk(qs, ks, vs, dos, st, delta, lam, q_shift, keep, c,
                                               gt, alpha, numerics, a_parts, dq_from_a)
            if dq_a is not None:
                dq_seg = alpha * dq_a
            if numerics == "gproj" and a_parts == 1:
                dk_seg = project_key_sum(dk_seg)
        _put(dq, b, qr, varlen, dq_seg.to(gdt))
        _put(dk, b, kr, varlen, dk_seg.to(gdt))
        _put(dv, b, kr, varlen, dv_seg.to(gdt))
    return dq, dk, dv


def emulate(q, k, v, do, *, numerics="gproj", causal=False, softmax_scale=None,
            window_size=(-1, -1), cu_seqlens_q=None, cu_seqlens_k=None, fp32_grads=False,
            a_parts=3, dq_from_a=False):
    """Forward and backward kernel arithmetic on the CPU: ``(out, lse, dq, dk, dv)``.
    ``a_parts``, ``dq_from_a``: see ``emulate_backward``."""
    kw = dict(numerics=numerics, causal=causal, softmax_scale=softmax_scale,
              window_size=window_size, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    out, lse, stats = emulate_forward(q, k, v, **kw)
    dq, dk, dv = emulate_backward(do, q, k, v, out, stats, fp32_grads=fp32_grads,
                                  a_parts=a_parts, dq_from_a=dq_from_a, **kw)
    return out, lse, dq, dk, dv
