"""Context-parallel (ring) attention, with GProj's lambda over *all* key shards.

For sequences that outgrow one GPU: every rank of a process group holds one chunk of the sequence
(q, k and v of the same positions); key/value chunks travel around the ring.

Forward: K/V chunks circulate; each rank attends its queries to each chunk (``chunks.forward_chunk``)
and merges the partial outputs through their softmax state (max, log2 row sum). In gproj mode the
keys are first centered by the single-device shift (a MIN and a MAX all-reduce of each rank's
key range), so every chunk's scores, and hence the merged max and the backward's recomputed P,
are those of one-device attention.

Backward: GProj's lambda_i = r_i / s_i needs r_i = Σ_j dS~_ij and s_i = Σ_j P~_ij over every key
of row i. Projecting each shard with its own lambda (what a ring over the single-device backward
would do) is not SPEC.md's GProj and does not give the one-device dQ. So:

1. pass 1 (K/V ring again): each rank accumulates, for its queries, dS~K, P~K, r and s over all
   key chunks in fp32, then forms the global lambda and dQ = alpha (dS~K - lambda P~K);
2. pass 2 (query ring): q, dO, the softmax state, (delta, lambda) and the query shift travel;
   each rank adds every query chunk's contribution to the dK and dV of its own keys, in fp32,
   with A = dS~ - lambda P~ built from the global lambda: every row of A sums to zero over all
   keys, so Σ_j dK_j vanishes globally.

Communication: ``torch.distributed`` point-to-point (NCCL for CUDA tensors, gloo for CPU tensors,
which run the CPU emulator of the kernels); the next chunk's transfer is posted before the
current chunk is computed. Layouts: ``"contiguous"`` (rank r holds positions [r n, (r+1) n)) and
``"zigzag"`` (the sequence cut into 2W pieces; rank r holds pieces r and 2W-1-r, which balances
causal work); ``shard``/``unshard`` convert.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist
from torch import Tensor

from . import chunks
from .centering import query_shift, shift_from_range
from .reference import NUMERICS, default_scale

LAYOUTS = ("contiguous", "zigzag")


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------

def shard(x: Tensor, rank: int, world_size: int, layout: str = "contiguous", dim: int = 1) -> Tensor:
    """This rank's chunk of a full-sequence tensor (sequence along ``dim``)."""
    _check_layout(layout)
    n = x.shape[dim]
    parts = world_size * (2 if layout == "zigzag" else 1)
    if n % parts:
        raise ValueError(f"sequence length {n} must be divisible by {parts} for {world_size} "
                         f"ranks in the {layout!r} layout")
    pieces = x.chunk(parts, dim)
    if layout == "contiguous":
        return pieces[rank]
    return torch.cat([pieces[rank], pieces[parts - 1 - rank]], dim)


def unshard(local_chunks: list[Tensor], layout: str = "contiguous", dim: int = 1) -> Tensor:
    """Inverse of ``shard``: the full-sequence tensor from every rank's chunk (rank order)."""
    _check_layout(layout)
    if layout == "contiguous":
        return torch.cat(local_chunks, dim)
    W = len(local_chunks)
    halves = [c.chunk(2, dim) for c in local_chunks]
    order = [halves[i][0] for i in range(W)] + [halves[W - 1 - i][1] for i in range(W)]
    return torch.cat(order, dim)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _blocks(q_owner: int, k_owner: int, n: int, causal: bool, layout: str):
    """The (query rows, key rows, causal) blocks of q_owner's chunk against k_owner's chunk that
    contain visible pairs. Chunks are equal-sized, so every block is fully visible or has the
    bottom-right diagonal of a square (diag_shift 0)."""
    every = slice(0, n)
    if not causal:
        return [(every, every, False)]
    if q_owner == k_owner:
        return [(every, every, True)]   # zigzag too: piece b sees all of piece a, a none of b
    if layout == "contiguous":
        return [(every, every, False)] if k_owner < q_owner else []
    h = n // 2
    if k_owner < q_owner:   # k's first piece precedes both q pieces, its second follows both
        return [(every, slice(0, h), False)]
    return [(slice(h, n), every, False)]   # q's second piece follows both k pieces, q's first none


# --------------------------------------------------------------------------------------------
# The ring
# --------------------------------------------------------------------------------------------

class _Ring:
    """Send to rank + 1, receive from rank - 1 (group ranks), asynchronously."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = peer((self.rank + 1) % self.world)
        self.prev = peer((self.rank - 1) % self.world)

    def start(self, tensors):
        """Post the transfer of ``tensors`` to the next rank; returns a handle for ``finish``."""
        recv = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
        send = [t.contiguous() for t in tensors]   # kept alive until the transfer completes
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in send]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in recv]
        return recv, dist.batch_isend_irecv(ops), send

    @staticmethod
    def finish(handle):
        recv, works, _send = handle
        for w in works:
            w.wait()
        return tuple(recv)

    def circulate(self, tensors):
        """Yield ``(source_rank, tensors of that rank)`` for every rank, starting with our own;
        the next transfer is in flight while the caller computes on the current one."""
        cur = tuple(tensors)
        for step in range(self.world):
            handle = self.start(cur) if step < self.world - 1 else None
            yield (self.rank - step) % self.world, cur
            if handle is not None:
                cur = self.finish(handle)


def global_key_shift(k: Tensor, group=None) -> Tensor:
    """The exact key centering shift of the whole (sharded) sequence: bitwise the single-device
    ``centering.key_shift`` of the concatenated keys, from a MIN and a MAX all-reduce."""
    kf = k.float()
    lo, hi = kf.amin(dim=1), kf.amax(dim=1)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    return shift_from_range(lo, hi, k.dtype)


def ring_forward(q, k, v, ring: _Ring, causal: bool, scale: float, numerics: str, layout: str):
    """Returns ``(out, stats, k_used)``: the local output, the merged softmax state (B, H, n, 2)
    and the keys the scores were taken against (centered in gproj mode)."""
    if numerics == "gproj":
        shift = global_key_shift(k, ring.group)
        k = (k.float() - shift.float().unsqueeze(1)).to(k.dtype)   # exact (centering.py)
    B, n, H, d = q.shape
    acc_o = torch.zeros((B, n, H, d), dtype=torch.float32, device=q.device)
    acc_m = torch.full((B, H, n), -math.inf, dtype=torch.float32, device=q.device)
    acc_l = torch.zeros((B, H, n), dtype=torch.float32, device=q.device)
    for src, (kc, vc) in ring.circulate((k.contiguous(), v.contiguous())):
        for qs, ks, cz in _blocks(ring.rank, src, n, causal, layout):
            o, st = chunks.forward_chunk(q[:, qs], kc[:, ks], vc[:, ks], softmax_scale=scale,
                                         numerics=numerics, causal=cz)
            chunks.merge_forward(acc_o[:, qs], acc_m[:, :, qs], acc_l[:, :, qs], o, st, scale)
    out, stats = chunks.finish_forward(acc_o, acc_m, acc_l, q.dtype)
    return out, stats, k


def ring_backward(dout, q, k, v, out, stats, ring: _Ring, causal: bool, scale: float,
                  numerics: str, layout: str):
    """Returns ``(dq, dk32, dv32)``: dQ in q's dtype, dK and dV of the local keys in fp32 (before
    their final rounding: where SPEC.md measures Σ_j dK_j)."""
    gproj = numerics == "gproj"
    B, n, H, d = q.shape
    f32 = dict(dtype=torch.float32, device=q.device)
    dout = dout.contiguous()
    # Pass 1: dQ's partial sums over every key chunk, then the global lambda.
    dq_acc = torch.zeros((B, n, H, d), **f32)
    pk_acc = torch.zeros((B, n, H, d), **f32) if gproj else None
    rs_acc = torch.zeros((B, H, n, 2), dtype=torch.float64, device=q.device) if gproj else None
    rowstate = torch.zeros((B, H, n, 4), **f32)
    for src, (kc, vc) in ring.circulate((k.contiguous(), v.contiguous())):
        for qs, ks, cz in _blocks(ring.rank, src, n, causal, layout):
            chunks.backward_dq_chunk(
                dout[:, qs], q[:, qs], kc[:, ks], vc[:, ks], out[:, qs], stats[:, :, qs],
                rowstate[:, :, qs], dq_acc[:, qs], pk_acc[:, qs] if gproj else None,
                rs_acc[:, :, qs] if gproj else None, softmax_scale=scale, numerics=numerics,
                causal=cz)
    dq = chunks.finish_dq(dq_acc, pk_acc, rs_acc, rowstate, scale, numerics, q.dtype)
    # Pass 2: every rank's queries visit; dK, dV of the local keys accumulate here.
    q_shift = query_shift(q) if gproj else torch.zeros((B, H, d), dtype=q.dtype, device=q.device)
    dk_acc = torch.zeros(k.shape, **f32)
    dv_acc = torch.zeros(v.shape, **f32)
    travelling = (q.contiguous(), dout, stats.contiguous(), rowstate, q_shift.contiguous())
    for src, (qc, doc, stc, rwc, qsh) in ring.circulate(travelling):
        for qs, ks, cz in _blocks(src, ring.rank, n, causal, layout):
            chunks.backward_dkdv_chunk(
                doc[:, qs], qc[:, qs], k[:, ks], v[:, ks], stc[:, :, qs], rwc[:, :, qs], qsh,
                dk_acc[:, ks], dv_acc[:, ks], softmax_scale=scale, numerics=numerics, causal=cz)
    return dq, dk_acc, dv_acc


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, numerics, layout):
        ring = _Ring(group)
        out, stats, k_used = ring_forward(q, k, v, ring, causal, scale, numerics, layout)
        ctx.save_for_backward(q, k_used, v, out, stats)
        ctx.args = (group, causal, scale, numerics, layout)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_used, v, out, stats = ctx.saved_tensors
        group, causal, scale, numerics, layout = ctx.args
        dq, dk, dv = ring_backward(dout, q, k_used, v, out, stats, _Ring(group), causal, scale,
                                   numerics, layout)
        return dq, dk.to(k_used.dtype), dv.to(v.dtype), None, None, None, None, None


# --------------------------------------------------------------------------------------------
# The user API
# --------------------------------------------------------------------------------------------

def ring_attention(q: Tensor, k: Tensor, v: Tensor, group=None, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, numerics: str = "gproj",
                   layout: str = "contiguous", check_group: bool = True) -> Tensor:
    """Attention over a sequence sharded across the ranks of ``group``; returns the local output.

    q: (batch, n, heads, d), k, v: (batch, n, heads_k, d): this rank's chunk of the sequence (the
    same ``n`` on every rank; see ``shard`` for the layouts), bf16 or fp16, head dim 64/128/256,
    CUDA tensors with NCCL or CPU tensors (CPU emulator) with gloo. ``causal`` is over global
    positions. Autograd-enabled: the backward is the exact global GProj (module docstring).
    ``check_group`` all-gathers the shapes and options once per call so that a mismatch between
    ranks is an error instead of a hang.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    _check_layout(layout)
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, n, heads, head_dim), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"{name}: dtype must be bfloat16 or float16, got {t.dtype}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} must have q's dtype and device ({q.dtype}, {q.device}), got "
                             f"({t.dtype}, {t.device})")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    B, n, H, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[1] != n or k.shape[3] != d:
        raise ValueError(f"k, v must be (batch={B}, n={n}, heads_k, d={d}) like q's chunk, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if d not in (64, 128, 256):
        raise ValueError(f"head_dim {d}: supported head dims are 64, 128 and 256")
    if H % k.shape[2]:
        raise ValueError(f"heads ({H}) must be a multiple of heads_k ({k.shape[2]})")
    if layout == "zigzag" and n % 2:
        raise ValueError(f"layout 'zigzag': the local chunk length must be even, got {n}")
    backend = dist.get_backend(group)
    if q.device.type == "cuda" and backend != "nccl":
        raise ValueError(f"CUDA tensors need an NCCL process group, got backend {backend!r}")
    if q.device.type == "cpu" and backend == "nccl":
        raise ValueError("CPU tensors need a gloo process group, got backend 'nccl'")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {q.device}: CPU or CUDA tensors only")
    scale = default_scale(d, softmax_scale)
    if check_group:
        _check_same_everywhere(group, q.device, B=B, n=n, heads=H, heads_k=k.shape[2], d=d,
                               causal=int(causal), layout=LAYOUTS.index(layout),
                               numerics=NUMERICS.index(numerics), dtype=int(q.dtype == torch.float16),
                               scale=int(round(scale * 2**30)))
    return _RingAttention.apply(q, k, v, group, bool(causal), scale, numerics, layout)


def _check_same_everywhere(group, device, **fields):
    W = dist.get_world_size(group)
    if W == 1:
        return
    mine = torch.tensor(list(fields.values()), dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(W)]
    dist.all_gather(every, mine, group=group)
    for r, theirs in enumerate(every):
        diff = [name for name, a, b in zip(fields, mine.tolist(), theirs.tolist()) if a != b]
        if diff:
            raise ValueError(f"ring_attention: rank {dist.get_rank(group)} and rank {r} disagree "
                             f"on {', '.join(diff)} (every rank must pass the same shapes and "
                             f"options)")
