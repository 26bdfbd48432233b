"""The user API: FlashAttention-3 layouts, GQA, varlen, and FA3-signature drop-ins."""

from __future__ import annotations

from . import ops  # (also registers torch.ops.gproj.*)
from .validation import (check_batch_limits, check_cu_seqlens, check_numerics, check_qkv,
                         check_scale, check_window)


def attention(q, k, v, *, causal=False, softmax_scale=None, window_size=(-1, -1),
              numerics="gproj", deterministic=False, return_lse=False):
    """Fused attention with an exact-max softmax and GProj-corrected BF16/FP16 gradients.

    Args:
        q: (batch, seqlen_q, heads, head_dim), bf16 or fp16, CUDA (or CPU: runs the emulator).
        k, v: (batch, seqlen_k, heads_k, head_dim); heads % heads_k == 0 (GQA/MQA).
        causal: causal mask aligned to the bottom right (FlashAttention-3's convention).
        softmax_scale: defaults to 1/sqrt(head_dim).
        window_size: (left, right) sliding window, -1 = unbounded.
        numerics: "gproj" (default; correct gradients) or "fa3" (FlashAttention-3's arithmetic,
            for A/B comparisons).
        deterministic: True guarantees bitwise-identical gradients across runs (every gradient
            element summed by one block in a fixed order). gproj's Hopper backward (sm_90,
            d=64/128, bf16) is so by construction and stays on; in fa3 mode and at d=256 the
            Hopper backward adds dQ tiles with asynchronous fp32 reduce-adds in varying order (dQ
            may differ in the last bits between runs), so True takes the mma.sync passes there.
        return_lse: also return the natural-log LSE, (batch, heads, seqlen_q) fp32.
    Returns:
        out (like q), or (out, lse).
    """
    check_qkv(q, k, v, varlen=False)
    check_numerics(numerics)
    left, right = check_window(causal, window_size)
    scale = check_scale(softmax_scale, q.shape[-1])
    check_batch_limits(q.shape[0], q.shape[2])
    out, lse, *_ = ops.call_attention(q, k, v, None, None, q.shape[1], k.shape[1], scale, left,
                                      right, numerics, deterministic)
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     causal=False, softmax_scale=None, window_size=(-1, -1), numerics="gproj",
                     deterministic=False, return_lse=False):
    """Variable-length attention on packed sequences.

    q: (total_q, heads, head_dim); k, v: (total_k, heads_k, head_dim); cu_seqlens_{q,k}: int32
    (batch + 1,) prefix sums of the sequence lengths (empty sequences allowed). The mask is
    applied per sequence. Returns out (total_q, heads, head_dim) or (out, lse (heads, total_q)).
    The cu_seqlens values are checked once per tensor (a device sync), and again only after an
    in-place write to it: pass the same tensors to every layer.
    """
    check_qkv(q, k, v, varlen=True)
    check_numerics(numerics)
    left, right = check_window(causal, window_size)
    scale = check_scale(softmax_scale, q.shape[-1])
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q,
                     max_seqlen_k, q.device)
    check_batch_limits(cu_seqlens_q.shape[0] - 1, q.shape[1])
    out, lse, *_ = ops.call_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                      int(max_seqlen_k), scale, left, right, numerics,
                                      deterministic)
    return (out, lse) if return_lse else out


def _unsupported(**kw):
    for name, (value, default) in kw.items():
        if value is not default and value != default:
            raise NotImplementedError(
                f"gproj_cuda.flash_attn_func: argument {name}={value!r} is not supported "
                f"(only the default {default!r})")


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False, *, numerics="gproj"):
    """Drop-in for FlashAttention-3's ``flash_attn_interface.flash_attn_func``.

    Same positional/keyword signature; FP8 descales, qv, softcap, attention chunks and split-KV
    are not supported and raise. ``pack_gqa``/``sm_margin`` are tuning knobs and are ignored.
    Returns out, or (out, softmax_lse) with ``return_attn_probs=True``.
    """
    _unsupported(qv=(qv, None), q_descale=(q_descale, None), k_descale=(k_descale, None),
                 v_descale=(v_descale, None), attention_chunk=(attention_chunk, 0),
                 softcap=(softcap, 0.0), num_splits=(num_splits, 1))
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale,
                     window_size=window_size, numerics=numerics, deterministic=deterministic,
                     return_lse=return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False, *, numerics="gproj"):
    """Drop-in for FlashAttention-3's ``flash_attn_varlen_func`` (see ``flash_attn_func``)."""
    _unsupported(seqused_q=(seqused_q, None), seqused_k=(seqused_k, None), qv=(qv, None),
                 q_descale=(q_descale, None), k_descale=(k_descale, None),
                 v_descale=(v_descale, None), attention_chunk=(attention_chunk, 0),
                 softcap=(softcap, 0.0), num_splits=(num_splits, 1))
    return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            causal=causal, softmax_scale=softmax_scale, window_size=window_size,
                            numerics=numerics, deterministic=deterministic,
                            return_lse=return_attn_probs)
