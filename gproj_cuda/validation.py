"""Input checks with messages that name the argument and what is allowed.

Everything the kernels rely on is checked here first (the C++ side checks again). Errors are
ValueError for a bad value and TypeError for a wrong type, raised before any work is queued.
"""

from __future__ import annotations

import math
import weakref

import torch

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
NUMERICS = ("gproj", "fa3")


def _is_tracing() -> bool:
    try:
        if torch.compiler.is_compiling():
            return True
    except AttributeError:  # older torch
        pass
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_numerics(numerics) -> str:
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {NUMERICS}, got {numerics!r}")
    return numerics


def check_window(causal, window_size) -> tuple[int, int]:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if causal:
        right = 0
    return left, right


def check_scale(softmax_scale, head_dim) -> float:
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be finite and > 0, got {softmax_scale!r}")
    return scale


def _check_tensor(name, t, rank, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be torch.bfloat16 or torch.float16, got {t.dtype}")
    if t.numel() > 0 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last (head) dimension, got strides "
                         f"{tuple(t.stride())}; call .contiguous() first")


def check_qkv(q, k, v, *, varlen: bool):
    """Shapes, dtypes, devices and strides of q, k, v. Returns (heads, heads_k, head_dim)."""
    rank = 3 if varlen else 4
    q_layout = "(total_q, heads, head_dim)" if varlen else "(batch, seqlen_q, heads, head_dim)"
    k_layout = ("(total_k, heads_k, head_dim)" if varlen
                else "(batch, seqlen_k, heads_k, head_dim)")
    _check_tensor("q", q, rank, q_layout)
    _check_tensor("k", k, rank, k_layout)
    _check_tensor("v", v, rank, k_layout)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type not in ("cuda", "cpu", "meta"):
        raise ValueError(f"q must be on a CUDA device (or the CPU, for the emulator), got {q.device}")
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not supported; supported head dims: {SUPPORTED_HEAD_DIMS}")
    if k.shape[-1] != d or v.shape[-1] != d:
        raise ValueError(f"q, k, v must share head_dim, got {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch size, got {q.shape[0]} and {k.shape[0]}")
    h, hk = q.shape[-2], k.shape[-2]
    if hk < 1 or h % hk:
        raise ValueError(f"heads ({h}) must be a positive multiple of heads_k ({hk}) (GQA/MQA)")
    if not varlen and q.shape[0] < 1:
        raise ValueError("batch size must be >= 1")
    return h, hk, d


# cu_seqlens tensors whose values have been read and found valid: id -> (weak reference, version
# counter, last offset, longest length). Reading the values is a device sync: ~0.1 ms of idle GPU
# per call at 16k tokens (the GPU waits while the host prepares the next launches; measured on
# the H200, bench/NOTES.md session 14), and 25-50% of a varlen forward's time. A model calls
# attention with the same cu_seqlens in every layer and in the backward, so they are read once:
# later calls with the same tensor object, unmodified (torch bumps `_version` on every in-place
# write, through any view), check their totals and maxima against the recorded values instead.
_CU_CHECKED: dict = {}


def _cu_values(cu: torch.Tensor):
    """(last offset, longest length) of a valid cu_seqlens tensor, cached; raises on bad values."""
    key = id(cu)
    hit = _CU_CHECKED.get(key)
    if hit is not None and hit[0]() is cu and hit[1] == cu._version:
        return hit[2], hit[3], None
    vals = cu.tolist()
    lens = [b - a for a, b in zip(vals, vals[1:])]
    if vals[0] != 0:
        return None, None, f"[0] must be 0, got {vals[0]}"
    if any(n < 0 for n in lens):
        return None, None, f" must be non-decreasing, got {vals}"
    last, longest = vals[-1], max(lens)
    try:
        ref = weakref.ref(cu, lambda _r, key=key: _CU_CHECKED.pop(key, None))
    except TypeError:  # (a tensor subclass without weak references: not cached)
        return last, longest, None
    _CU_CHECKED[key] = (ref, cu._version, last, longest)
    return last, longest, None


def check_cu_seqlens(cu_q, cu_k, total_q, total_k, max_q, max_k, device):
    """cu_seqlens_{q,k}: int32, 1-D, batch + 1 entries, starting at 0, non-decreasing, ending
    within the packed tensors; max_seqlen_{q,k} at least every length. The value checks read the
    tensors (a device sync) the first time a tensor is seen, and again after it is modified in
    place; they are skipped while compiling or capturing a CUDA graph."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be torch.int32, got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu.shape)}")
        if cu.device != device:
            raise ValueError(f"{name} must be on {device} like q, got {cu.device}")
        if cu.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
    if cu_q.shape[0] != cu_k.shape[0]:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), "
                         f"got {cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(m, int) or m < 0:
            raise ValueError(f"{name} must be a non-negative int, got {m!r}")
    if _is_tracing() or device.type == "meta":
        return
    for name, cu, total, mx in (("cu_seqlens_q", cu_q, total_q, max_q),
                                ("cu_seqlens_k", cu_k, total_k, max_k)):
        last, longest, error = _cu_values(cu)
        if error is not None:
            raise ValueError(f"{name}{error}")
        if last > total:
            raise ValueError(f"{name}[-1] = {last} exceeds the {total} rows of the packed tensor")
        if longest > mx:
            raise ValueError(f"max_seqlen_{name[-1]} = {mx} is smaller than the longest sequence "
                             f"({longest}) in {name}")


def check_batch_limits(batch, heads):
    if batch > 65535:
        raise ValueError(f"batch {batch} exceeds the supported 65535")
    if heads > 65535:
        raise ValueError(f"heads {heads} exceeds the supported 65535")
