"""Attention of one query chunk against one key chunk, as partial results.

The building blocks of context parallelism (``distributed.py``); not part of the simple API.
GProj's lambda_i = r_i / s_i needs the row sums r_i = Σ_j dS~_ij and s_i = Σ_j P~_ij over *all*
keys of row i, so a sharded backward cannot finish dQ (nor start dK) chunk by chunk. These
functions expose the kernels' two passes with their fp32 partial sums instead:

* ``forward_chunk``: out and the softmax state ``stats = [raw max, log2 row sum]`` of the chunk
  pair; the caller merges chunks through ``stats`` (``merge_forward``).
* ``backward_dq_chunk``: pass 1 with the *global* stats; adds ``dS~ K``, ``P~ K``, ``r`` and
  ``s`` (fp32; r, s fp64) into the caller's accumulators and writes ``rowstate = (delta, 0, 0)``.
  After the last
  key chunk: ``finish_dq`` forms lambda = r / s and dQ = alpha (dS~K - lambda P~K).
* ``backward_dkdv_chunk``: pass 2 with the global stats and ``rowstate = (delta, lambda hi,
  lambda lo)``; adds
  this query chunk's fp32 dK (scaled) and dV into the caller's accumulators.

Same arithmetic as the one-chunk kernels (``reference.py`` on CPU tensors, the CUDA kernels'
``partial`` mode on GPU tensors) up to the order of the fp32 additions across chunks.

Layout: dense ``q (B, nq, H, d)``, ``k, v (B, nk, Hk, d)``; per-row state ``(B, H, nq, e)``:
``stats`` fp32 e=2, ``rowstate`` fp32 e=4 (delta, lambda hi, lambda lo, unused), ``rs_acc``
fp64 e=2 (r, s).
In gproj mode ``k`` must already be centered by a shift common to every chunk (``global_key_shift``
in ``distributed.py``), since the forward's max and the backward's recomputed P must refer to the
same scores. Masks: ``causal`` is FlashAttention's bottom-right alignment, moved by ``diag_shift``
(query i sees key j iff j <= i + nk - nq + diag_shift).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import reference as R
from .masks import visible


def _window(causal: bool) -> tuple[int, int]:
    return (-1, 0) if causal else (-1, -1)


def _rowstat_strides(*ts: Tensor) -> tuple[int, int]:
    """(batch, head) strides in units of one row's record, shared by every per-row state tensor
    passed (the kernels index all of them with one pair of strides)."""
    e = ts[0].shape[-1]
    want = (ts[0].stride(0) // e, ts[0].stride(1) // e)
    for t in ts:
        e = t.shape[-1]
        if t.stride(-1) != 1 or t.stride(-2) != e or (t.stride(0) // e, t.stride(1) // e) != want \
                or t.stride(0) % e or t.stride(1) % e:
            raise ValueError("per-row state tensors must be (B, H, n, e) views of contiguous "
                             "tensors with the same (B, H, n) extents")
    return want


def _check_accum(t: Tensor, name: str):
    # The kernels add into these in place: they cannot be copied to satisfy alignment.
    if t.dtype != torch.float32 or t.stride(-1) != 1 or t.data_ptr() % 16 or \
            any(s % 8 for s in t.stride()[:-1]):
        raise ValueError(f"{name}: need an fp32 tensor with 16-byte aligned rows (got dtype "
                         f"{t.dtype}, strides {t.stride()})")


def _cuda_params(q, k, v, scale, causal, numerics, diag_shift, *rowstats):
    from .ops import _params
    wl, wr = _window(causal)
    p = _params(q, k, v, None, None, 0, 0, scale, wl, wr, numerics)
    p.rs_batch_stride, p.rs_head_stride = _rowstat_strides(*rowstats)
    p.diag_shift = int(diag_shift)
    return p


def _backward_params(q, k, v, dout, stats, rowstate, scale, causal, numerics, diag_shift,
                     passes, *more_rowstats):
    """Params of one partial backward pass (1: dQ, 2: dK/dV) on already kernel-ready tensors."""
    p = _cuda_params(q, k, v, scale, causal, numerics, diag_shift, stats, rowstate,
                     *more_rowstats)
    p.backward_passes, p.partial = passes, 1
    p.stats, p.rowstate = stats.data_ptr(), rowstate.data_ptr()
    p.dout, p.do_stride = dout.data_ptr(), list(dout.stride()[:3])
    return p


def _ready(*ts):
    from .ops import _kernel_ready
    return tuple(_kernel_ready(t) for t in ts)


def forward_chunk(q: Tensor, k: Tensor, v: Tensor, *, softmax_scale: float, numerics: str,
                  causal: bool = False, diag_shift: int = 0) -> tuple[Tensor, Tensor]:
    """Forward of one chunk pair: ``(out (B, nq, H, d) fp32, stats (B, H, nq, 2))``.

    ``out`` is the normalized output before its rounding to the input dtype: merged chunks are
    then rounded once, as on one device."""
    B, nq, H, d = q.shape
    stats = torch.empty((B, H, nq, 2), dtype=torch.float32, device=q.device)
    if q.device.type == "cpu":
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        keep = visible(nq, k.shape[1], *_window(causal), q.device, diag_shift)
        c = R._scale_log2(softmax_scale)
        with torch.autocast("cpu", enabled=False):
            for b in range(B):
                o, st = R._forward_chunk(q[b].transpose(0, 1).float(), k[b].transpose(0, 1).float(),
                                         v[b].transpose(0, 1).float(), keep, c, numerics, q.dtype,
                                         torch.float32)
                out[b] = o.transpose(0, 1)
                stats[b] = st
        return out, stats
    from . import _ext
    from .ops import tile_counter
    q, k, v = _ready(q, k, v)
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty((B, H, nq), dtype=torch.float32, device=q.device)
    p = _cuda_params(q, k, v, softmax_scale, causal, numerics, diag_shift, stats)
    p.out_f32, p.o_stride = out.data_ptr(), list(out.stride()[:3])
    p.lse, p.stats = lse.data_ptr(), stats.data_ptr()
    zero_shift = None
    if numerics == "gproj":  # keys come centered; the kernel's lse correction is then 0
        zero_shift = torch.zeros((B, k.shape[2], d), dtype=k.dtype, device=k.device)
        p.k_shift = zero_shift.data_ptr()
    counter = tile_counter(p, q.device)  # noqa: F841 (alive until the launch is queued)
    _ext.extension().forward(p)
    return out, stats


def merge_forward(acc_o: Tensor, acc_m: Tensor, acc_l: Tensor, out: Tensor, stats: Tensor,
                  softmax_scale: float):
    """Merge a chunk's ``(out, stats)`` into running fp32 accumulators, in place.

    ``acc_o (B, n, H, d)`` holds Σ_chunks l_c 2^((m_c - m) c) out_c, ``acc_m``/``acc_l`` (B, H, n)
    the running max (-inf: nothing seen yet) and row sum relative to it: the online softmax of the
    kernels, one level up.
    """
    c = float(R._scale_log2(softmax_scale))
    m_c, log2l_c = stats[..., 0], stats[..., 1]
    seen = ~(torch.isinf(m_c) & (m_c > 0))            # (+inf, 0): the row saw no key
    m_c = torch.where(seen, m_c, torch.full_like(m_c, -math.inf))
    m_new = torch.maximum(acc_m, m_c)
    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    a_old = torch.where(torch.isinf(acc_m), torch.zeros_like(acc_m), torch.exp2((acc_m - safe) * c))
    w_c = torch.where(seen, torch.exp2((m_c - safe) * c + log2l_c), torch.zeros_like(m_c))
    acc_l.mul_(a_old).add_(w_c)
    acc_m.copy_(m_new)
    acc_o.mul_(a_old.transpose(1, 2).unsqueeze(-1))
    acc_o.add_(out.float() * w_c.transpose(1, 2).unsqueeze(-1))


def finish_forward(acc_o: Tensor, acc_m: Tensor, acc_l: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """``(out, stats)`` of the merged chunks, in the forward kernels' conventions."""
    inv = torch.where(acc_l > 0, 1.0 / acc_l, torch.zeros_like(acc_l))
    out = (acc_o * inv.transpose(1, 2).unsqueeze(-1)).to(dtype)
    empty = acc_l <= 0
    stats = torch.stack([torch.where(empty, torch.full_like(acc_m, math.inf), acc_m),
                         torch.where(empty, torch.zeros_like(acc_l), torch.log2(acc_l))], -1)
    return out, stats


def backward_dq_chunk(dout, q, k, v, out, stats, rowstate, dq_acc, pk_acc, rs_acc, *,
                      softmax_scale: float, numerics: str, causal: bool = False,
                      diag_shift: int = 0) -> None:
    """Pass 1 for one key chunk, in place: ``dq_acc += dS~ K``; gproj: ``pk_acc += P~ K``,
    ``rs_acc += (r, s)`` (fp64); ``rowstate = (delta, 0, 0)``. ``stats`` are the global (merged)
    ones."""
    gproj = numerics == "gproj"
    for t, name in ((dq_acc, "dq_acc"),) + (((pk_acc, "pk_acc"),) if gproj else ()):
        _check_accum(t, name)
    B, nq, H, d = q.shape
    if q.device.type == "cpu":
        keep = visible(nq, k.shape[1], *_window(causal), q.device, diag_shift)
        c = R._scale_log2(softmax_scale)
        gt = R._grad_gemm_dtype(q.dtype, numerics)
        with torch.autocast("cpu", enabled=False):
            for b in range(B):
                qs, dos = q[b].transpose(0, 1).float(), dout[b].transpose(0, 1).float()
                ks, vs = k[b].transpose(0, 1).float(), v[b].transpose(0, 1).float()
                delta = (dos * out[b].transpose(0, 1).float()).sum(-1, keepdim=True)
                dsk, pk, r, s = R._dq_chunk(qs, ks, vs, dos, stats[b], delta, keep, c, gt,
                                            numerics)
                rowstate[b, ..., 0] = delta[..., 0]
                rowstate[b, ..., 1:] = 0.0
                dq_acc[b] += dsk.transpose(0, 1)
                if gproj:
                    pk_acc[b] += pk.transpose(0, 1)
                    rs_acc[b, ..., 0] += r[..., 0]
                    rs_acc[b, ..., 1] += s[..., 0]
        return
    from . import _ext
    q, k, v, out, dout = _ready(q, k, v, out, dout)
    p = _backward_params(q, k, v, dout, stats, rowstate, softmax_scale, causal, numerics,
                         diag_shift, 1, *((rs_acc,) if gproj else ()))
    p.out, p.o_stride = out.data_ptr(), list(out.stride()[:3])
    p.dq_accum, p.dq_stride = dq_acc.data_ptr(), list(dq_acc.stride()[:3])
    if gproj:
        if pk_acc.stride() != dq_acc.stride():
            raise ValueError("pk_acc must have dq_acc's strides")
        p.pk_accum, p.rs_accum = pk_acc.data_ptr(), rs_acc.data_ptr()
    _ext.extension().backward(p)


def finish_dq(dq_acc: Tensor, pk_acc, rs_acc, rowstate: Tensor, softmax_scale: float,
              numerics: str, dtype) -> Tensor:
    """After every key chunk: lambda = r / s (fp64) into ``rowstate[..., 1:3]`` as hi + lo and
    dQ = alpha (dS~K - lambda P~K) in fp32, rounded once to ``dtype``."""
    alpha = R._f32(softmax_scale).to(dq_acc.device)
    if numerics != "gproj":
        return (alpha * dq_acc).to(dtype)
    hi, lo = R._lambda(rs_acc[..., 0], rs_acc[..., 1])
    rowstate[..., 1], rowstate[..., 2] = hi, lo
    return (alpha * (dq_acc - hi.transpose(1, 2).unsqueeze(-1) * pk_acc)).to(dtype)


def backward_dkdv_chunk(dout, q, k, v, stats, rowstate, q_shift, dk_acc, dv_acc, *,
                        softmax_scale: float, numerics: str, causal: bool = False,
                        diag_shift: int = 0) -> None:
    """Pass 2 for one query chunk, in place: ``dk_acc += alpha dK``, ``dv_acc += dV`` of the
    keys of ``k``. ``rowstate = (delta, lambda hi, lambda lo)`` from pass 1 over all key chunks; ``q_shift``
    (B, H, d), q's dtype: the query centering (``centering.query_shift(q)``)."""
    _check_accum(dk_acc, "dk_acc")
    _check_accum(dv_acc, "dv_acc")
    gproj = numerics == "gproj"
    B, nq, H, d = q.shape
    if q.device.type == "cpu":
        keep = visible(nq, k.shape[1], *_window(causal), q.device, diag_shift)
        c = R._scale_log2(softmax_scale)
        gt = R._grad_gemm_dtype(q.dtype, numerics)
        alpha = R._f32(softmax_scale)
        with torch.autocast("cpu", enabled=False):
            for b in range(B):
                qs, dos = q[b].transpose(0, 1).float(), dout[b].transpose(0, 1).float()
                ks, vs = k[b].transpose(0, 1).float(), v[b].transpose(0, 1).float()
                rs = rowstate[b]
                dk, dv, _ = R._dkdv_chunk(qs, ks, vs, dos, stats[b], rs[..., 0:1],
                                          (rs[..., 1:2], rs[..., 2:3]),
                                          q_shift[b].float() if gproj else None, keep, c, gt,
                                          alpha, numerics)
                dk_acc[b] += dk.transpose(0, 1)
                dv_acc[b] += dv.transpose(0, 1)
        return
    from . import _ext
    q, k, v, dout = _ready(q, k, v, dout)
    p = _backward_params(q, k, v, dout, stats, rowstate, softmax_scale, causal, numerics,
                         diag_shift, 2)
    p.dk_accum, p.dk_stride = dk_acc.data_ptr(), list(dk_acc.stride()[:3])
    p.dv_accum, p.dv_stride = dv_acc.data_ptr(), list(dv_acc.stride()[:3])
    if gproj:
        q_shift = q_shift.contiguous()
        p.q_shift = q_shift.data_ptr()
    _ext.extension().backward(p)
