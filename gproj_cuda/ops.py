"""torch.library custom ops: ``gproj::attention`` and ``gproj::attention_backward``.

They take already-validated arguments (the user API in ``api.py`` validates) and run the CUDA
kernels on CUDA tensors or the CPU emulator (``reference.emulate_*``) on CPU tensors, so the same
op is testable (``torch.library.opcheck``, ``torch.compile``) on a machine without a GPU. Fake
implementations give shapes to the compiler; autograd connects the two ops.

Outputs of the forward op: ``out`` (the input's shape, contiguous), ``lse`` (natural log, fp32,
(B, H, Nq) or varlen (H, Tq)) and ``stats`` (fp32, lse.shape + (2,)): the kernels' softmax state
``[raw score max, log2 row sum]`` that the backward needs at full precision (an fp32 LSE alone
loses an ulp of a large number, which scales a whole row of P); and ``k_shift``: in gproj mode on
CUDA the exact key shift c (K's dtype, (sequences, heads_k, d)) the forward's centering pre-pass
found, so that the backward writes K' = K - c without reading K for its range again (~25-30 us
per call at 16k tokens); elsewhere an empty tensor.

``call_attention`` is what the user API calls: the op under ``torch.compile``, fake tensors,
dispatch modes and tensor subclasses; in plain eager mode the same bodies through a
``torch.autograd.Function`` (or, without grad, directly), since a Python custom op's dispatch
and autograd wrapper cost ~15 us without grad and ~60 us with it per call on a development CPU,
against ~20 for the Function (bench/NOTES.md session 35): host time that sets the pace of short
calls.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _ext
from .reference import emulate_backward, emulate_forward

_NUMERICS_CODE = {"gproj": 0, "fa3": 1}


def _poison() -> bool:
    # Tests set GPROJ_DEBUG_POISON=1: outputs start as NaN so an element a kernel fails to write
    # cannot pass for a result. (Read once per forward or backward call, not per tensor: an
    # environment lookup costs ~1-2 us on the GPU machine's host.)
    return os.environ.get("GPROJ_DEBUG_POISON") == "1"


def _new(shape, dtype, device, poison=False):
    if poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


# The host path of one call is what sets the pace of short calls (B = 1, N = 256: ~40-70 us of
# host time per forward against a few us of GPU time; bench/NOTES.md session 36), so the per-call
# lookups below are the cheap forms, each measured on the GPU machine's host:
# torch.cuda.current_stream(device).cuda_stream costs ~5-9 us (a Stream object built per call),
# the raw handle ~0.2; a device's availability and compute capability do not change while the
# process runs.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(device: torch.device) -> int:
    """The current CUDA stream's handle on ``device`` (a CUDA device with an index)."""
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


_ready_devices: set = set()


def _check_device(device: torch.device) -> None:
    """A RuntimeError naming why the kernels cannot run on ``device``; once they can, not asked
    again."""
    if device.index in _ready_devices:
        return
    reason = _ext.unavailable_reason(device.index)
    if reason is not None:
        raise RuntimeError(f"gproj_cuda cannot run on {device}: {reason}")
    _ready_devices.add(device.index)


@functools.lru_cache(maxsize=None)
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def tile_counter(p, device, zeroed=None) -> Optional[Tensor]:
    """Scratch for the persistent Hopper forward's tile counter (AttnParams::tile_counter), set
    in ``p`` under a mask or in a varlen batch (where its query tiles differ in length); the
    launch zeroes it, unless ``zeroed`` (an int32 already 0 by then: the centering pass's) is
    taken. The caller keeps the returned tensor alive until the launch is queued."""
    if p.window_left < 0 and p.window_right < 0 and not p.cu_seqlens_q:
        return None
    if zeroed is not None:
        p.tile_counter, p.tile_counter_zeroed = zeroed.data_ptr(), 1
        return zeroed
    counter = torch.empty(1, dtype=torch.int32, device=device)
    p.tile_counter = counter.data_ptr()
    return counter


def _rowstat_shape(q: Tensor, varlen: bool, heads: int):
    return (heads, q.shape[0]) if varlen else (q.shape[0], heads, q.shape[1])


def _kernel_ready(t: Tensor) -> Tensor:
    """The kernels read 16-byte chunks: rows, heads and batches must start 16-byte aligned."""
    ptr_ok = t.data_ptr() % 16 == 0
    if ptr_ok and t.is_contiguous():  # (the head dims are multiples of 8: every stride is)
        return t
    if ptr_ok and all(s % 8 == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1:
        return t
    return t.contiguous()


def _strides3(t: Tensor, varlen: bool):
    s = t.stride()
    return [0, s[0], s[1]] if varlen else [s[0], s[1], s[2]]


def _params(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics):
    C = _ext.extension()
    _check_device(q.device)
    varlen = cu_q is not None
    p = C.Params()
    p.q, p.k, p.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    p.q_stride, p.k_stride, p.v_stride = (_strides3(t, varlen) for t in (q, k, v))
    p.batch = (cu_q.shape[0] - 1) if varlen else q.shape[0]
    p.heads, p.heads_k, p.head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    p.seqlen_q = max_q if varlen else q.shape[1]
    p.seqlen_k = max_k if varlen else k.shape[1]
    if varlen:
        p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
        p.total_q, p.total_k = q.shape[0], k.shape[0]
        p.rs_batch_stride, p.rs_head_stride = 0, q.shape[0]
    else:
        p.rs_batch_stride, p.rs_head_stride = q.shape[2] * q.shape[1], q.shape[1]
    p.softmax_scale = scale
    p.window_left, p.window_right = wl, wr
    p.dtype = 0 if q.dtype == torch.bfloat16 else 1
    p.numerics = _NUMERICS_CODE[numerics]
    p.device = q.device.index
    p.stream = _stream(q.device)
    return p


def _k_shift_shape(k, cu_k):
    return ((cu_k.shape[0] - 1) if cu_k is not None else k.shape[0], k.shape[-2], k.shape[-1])


def center_keys_cuda(k, cu_k, max_k, shift_only=False, flags=None, shift=None, approx=False,
                     counter=False):
    """Exact key centering on the GPU (csrc/prepost/center_keys.cuh): ``(K - c, c)``, bitwise
    equal to ``centering.center_keys`` (the PyTorch reference) in two fused kernels.

    ``flags`` (int32, (sequences, heads)): lazy mode for the forward. K' is written only for the
    (sequence, head) pairs with a nonzero shift, which get flag 1; elsewhere K' = K and is left
    unwritten (flag 0), and the forward kernel reads K there.
    ``shift``: c as an earlier call returned it for the same K (the forward's, in the backward):
    the range pass is skipped and only K' (and the flags) are written.
    ``approx``: the queries' rule (``centering.query_shift``), for the dK GEMM's Q' = Q - c.
    ``counter`` (with the range pass, i.e. no ``shift``): also returns a one-int32 tensor that the
    pass's memset zeroed (its workspace's spare word), for the forward's tile counter
    (``forward_kernel``'s ``zeroed_counter``): ``(kc, shift, counter)``."""
    if counter and shift is not None:
        raise ValueError("center_keys_cuda: counter=True needs the range pass, whose memset zeroes "
                         "the counter; got a shift, which skips that pass")
    C = _ext.extension()
    varlen = cu_k is not None
    shape = _k_shift_shape(k, cu_k)
    nseq = shape[0]
    kc = None if shift_only else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    p = C.Params()
    if shift is None:
        shift = torch.empty(shape, dtype=k.dtype, device=k.device)
        # the ranges (2 x shape) and four spare words, all zeroed by the pass (params.h)
        work = torch.empty(2 * math.prod(shape) + 4, dtype=torch.int32, device=k.device)
        p.center_workspace = work.data_ptr()
    else:
        if (tuple(shift.shape) != shape or shift.dtype != k.dtype or shift.device != k.device
                or not shift.is_contiguous()):
            raise ValueError(f"k_shift: expected a contiguous {k.dtype} tensor of shape {shape} "
                             f"on {k.device} (the forward's), got {shift.dtype} "
                             f"{tuple(shift.shape)} on {shift.device}")
        p.k_shift_given = 1
    p.center_approx = int(approx)
    p.k, p.k_stride = k.data_ptr(), _strides3(k, varlen)
    if kc is not None:
        p.k_centered, p.kc_stride = kc.data_ptr(), _strides3(kc, varlen)
    p.k_shift = shift.data_ptr()
    if flags is not None:
        assert flags.shape == (nseq, k.shape[-2]) and flags.dtype == torch.int32
        p.k_center_flags = flags.data_ptr()
    # (the pass reads the keys' side: heads_k, cu_seqlens_k, ...; run_center_keys)
    p.batch, p.heads_k, p.head_dim = nseq, k.shape[-2], k.shape[-1]
    p.seqlen_k = max_k if varlen else k.shape[1]
    if varlen:
        p.cu_seqlens_k = cu_k.data_ptr()
        p.total_k = k.shape[0]
    p.dtype = 0 if k.dtype == torch.bfloat16 else 1
    p.device = k.device.index
    p.stream = _stream(k.device)
    C.center_keys(p)
    if counter:
        return kc, shift, work[-4:-3]
    return kc, shift


def _empty_problem(q, k) -> bool:
    return q.numel() == 0 or k.numel() == 0


def forward_cuda(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics,
                 return_k_shift=False):
    """Kernel forward. Returns (out, lse, stats); with ``return_k_shift`` also the gproj
    centering's shift c (None in fa3 mode and for an empty problem), which ``backward_cuda``
    takes back as ``k_shift``."""
    varlen = cu_q is not None
    h = q.shape[-2]
    rs = _rowstat_shape(q, varlen, h)
    shift = None
    if _empty_problem(q, k):  # nothing to attend to: out 0, lse +inf, p = 0 in the backward
        stats = torch.zeros(rs + (2,), dtype=torch.float32, device=q.device)
        stats[..., 0] = math.inf
        res = (torch.zeros(q.shape, dtype=q.dtype, device=q.device),
               torch.full(rs, math.inf, dtype=torch.float32, device=q.device), stats)
    elif numerics != "gproj":
        q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
        res = forward_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics)
    else:
        # exact centering: softmax and gradients unchanged; K' where the pre-pass wrote it (flag
        # 1), the user's K elsewhere. The pre-pass (lazy, center_keys_cuda's) and the forward
        # from one set of params, and the pass's workspace, the forward's tile counter and the
        # lazy flags in one allocation: gproj's host path per call is what sets the time of
        # short calls (bench/NOTES.md session 35).
        q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
        p = _params(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics)
        shape = _k_shift_shape(k, cu_k)
        pairs = shape[0] * shape[1]
        # the ranges (2 x shape), four spare words (zeroed by the pass: the counter), the flags
        work = torch.empty(2 * pairs * shape[2] + 4 + pairs, dtype=torch.int32, device=k.device)
        kc = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        shift = torch.empty(shape, dtype=k.dtype, device=k.device)
        p.center_workspace = work.data_ptr()
        p.k_centered, p.kc_stride = kc.data_ptr(), _strides3(kc, cu_k is not None)
        p.k_shift = shift.data_ptr()
        p.k_center_flags = work.data_ptr() + 4 * (2 * pairs * shape[2] + 4)
        _ext.extension().center_keys(p)
        res = _launch_forward(p, q, cu_q is not None, zeroed_counter=work[-pairs - 4:-pairs - 3])
    return res + (shift,) if return_k_shift else res


def forward_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics, k_shift=None,
                   k_centered=None, center_flags=None, zeroed_counter=None):
    """The forward kernel alone, on keys prepared by the caller (kernel-ready tensors): gproj
    needs ``k_shift``; with ``k_centered`` (and optionally the lazy pre-pass's ``center_flags``)
    it reads K' instead of ``k`` where centered (csrc/common/tile.cuh, reads_centered_keys).
    ``zeroed_counter``: an int32 that holds 0 by the time the forward runs (the centering pass's,
    ``center_keys_cuda(counter=True)``), taken as the tile counter without the launch's memset,
    so that the forward directly follows the pre-pass's kernel (its programmatic dependent).
    Returns (out, lse, stats)."""
    varlen = cu_q is not None
    p = _params(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics)
    if k_shift is not None:
        p.k_shift = k_shift.data_ptr()
    if k_centered is not None:
        p.k_centered, p.kc_stride = k_centered.data_ptr(), _strides3(k_centered, varlen)
    if center_flags is not None:
        p.k_center_flags = center_flags.data_ptr()
    return _launch_forward(p, q, varlen, zeroed_counter)


def _launch_forward(p, q, varlen, zeroed_counter=None):
    """The forward kernel on params ``p`` (inputs and keys set): allocates out, lse and the row
    statistics, sets the tile counter (``forward_kernel``'s ``zeroed_counter``), launches."""
    rs = _rowstat_shape(q, varlen, q.shape[-2])
    poison = _poison()
    out = _new(q.shape, q.dtype, q.device, poison)
    lse = _new(rs, torch.float32, q.device, poison)
    stats = _new(rs + (2,), torch.float32, q.device, poison)
    p.out, p.o_stride = out.data_ptr(), _strides3(out, varlen)
    p.lse, p.stats = lse.data_ptr(), stats.data_ptr()
    counter = tile_counter(p, q.device, zeroed_counter)  # noqa: F841 (alive until queued)
    _ext.extension().forward(p)
    return out, lse, stats


def _hopper_backward(q: Tensor, numerics: str, hopper: Optional[bool]) -> bool:
    """Whether the Hopper backward (csrc/backward/bwd_kv_sm90.cuh; at d = 256
    bwd_kv_dkvt_sm90.cuh in fa3 mode, bwd_kv_split_sm90.cuh in gproj) runs: the default (``hopper=None``) unless GPROJ_HOPPER_BWD=0, where it
    covers the call so far (sm_90, head dims 64, 128 and 256; fa3 numerics in bf16/fp16, gproj in
    bf16); elsewhere the mma.sync passes run. In fa3 mode and at d = 256 its dQ tiles are summed
    by asynchronous fp32 reduce-adds in varying order: not bitwise reproducible
    (``deterministic=True`` passes hopper=False there: ``_reduce_adds_dq``)."""
    if hopper is None:
        hopper = os.environ.get("GPROJ_HOPPER_BWD", "1") != "0"
    covered = (numerics == "fa3" or q.dtype == torch.bfloat16) and q.shape[-1] in (64, 128, 256)
    return (hopper and covered
            and _capability_major(q.device.index) == 9)


def _reduce_adds_dq(numerics: str, d: int = 128) -> bool:
    """Whether the Hopper backward sums dQ by fp32 reduce-adds (order varies between runs): fa3
    mode, gproj at d = 256 (csrc/backward/bwd_kv_split_sm90.cuh) and gproj's variant 4."""
    return numerics == "fa3" or d == 256 or os.environ.get("GPROJ_BWD_VARIANT") == "4"


# Keys per slot of the dK key sums (csrc/prepost/dk_project.cuh, kKeysumSlot).
DK_KEYSUM_SLOT = 64


def _dkv_tile_keys(d: int, gproj: bool = False) -> int:
    """Keys per tile of the split group's dK / dV sums: the KV-outer pass's key tile
    (csrc/api/params.h, dkv_tile_keys; at d = 256 80 in fa3 mode's transposed pass, 64 in
    gproj's head-dim-split one)."""
    if d == 256:
        return 64 if gproj else 80
    return 128


def _kv_head_splits(numerics: str, q: Tensor, k: Tensor, varlen: bool,
                    causal_like: bool = False) -> int:
    """Over how many blocks per key tile the Hopper backward splits a kv head's query heads
    (AttnParams::kv_head_splits; 1: one block walks the whole group). Dense inputs; fa3 mode,
    and gproj at d = 256 (its head-dim-split pass).
    Defaults, measured interleaved against one block per group (bench/NOTES.md):
    - d = 128 under a causal-like mask, even group: two shares (session 39, 16 heads on 2 kv
      heads: -12% at N = 2k, -7% at 4k, -3% at 16k; one block per query head -9 / -4 / -1%;
      without a mask two shares were 1-2% slower, at d = 64 4k causal 5% slower);
    - d = 256: one block per query head (session 40, 8 heads on 1 kv head, N = 2k / 4k / 16k:
      -21 / -20 / -27% without a mask, -15 / -15 / -21% causal; two and four shares gained less).
      The transposed pass's 80-key blocks of a whole group were 1.6 waves at 4k.
    - gproj at d = 256 under a causal-like mask, group of 4 or more, even: shares of two query
      heads (session 42, H100, 8 heads on 1 kv head: 4 shares -22% at N = 4k, -14% at 16k; 2 and
      8 within 2.5% of it; without a mask +0.9 to +2.5% at 4k, -0.2 to -0.7% at 16k: none).
    GPROJ_BWD_KV_SPLITS=S asks for S shares (S divides the group; 1: one block per group),
    GPROJ_BWD_VARIANT=22 for one block per query head, as FlashAttention-3's GQA backward."""
    group = q.shape[-2] // k.shape[-2]
    gproj_split_pass = numerics == "gproj" and q.shape[-1] == 256
    if (numerics != "fa3" and not gproj_split_pass) or varlen or group == 1:
        return 1
    if numerics == "fa3" and q.shape[-1] == 256 and os.environ.get("GPROJ_BWD_VARIANT") == "16":
        return 1  # (fa3 mode's head-dim-split d = 256 pass has no split group)
    env = os.environ.get("GPROJ_BWD_KV_SPLITS")
    if env:
        splits = int(env)
        if splits < 1 or group % splits:
            raise ValueError(f"GPROJ_BWD_KV_SPLITS={env}: must divide the query heads per kv "
                             f"head ({group})")
        return splits
    if gproj_split_pass:
        return group // 2 if causal_like and group >= 4 and group % 2 == 0 else 1
    if os.environ.get("GPROJ_BWD_VARIANT") == "22":
        return group
    if q.shape[-1] == 256:
        return group
    return 2 if causal_like and q.shape[-1] == 128 and group % 2 == 0 else 1


def _dkv_accum_bytes(p) -> int:
    """Bytes of the split group's dK / dV sums and counters (csrc/api/params.h,
    hopper_dkv_accum_bytes)."""
    keys = _dkv_tile_keys(p.head_dim, p.numerics == _NUMERICS_CODE["gproj"])
    tiles = p.batch * p.heads_k * ((p.seqlen_k + keys - 1) // keys)
    return tiles * (2 * keys * p.head_dim * 4 + 4)


def _projects_dk(numerics: str) -> bool:
    """Whether the Hopper backward rounds A once and projects dK onto Σ_j dK_j = 0 afterwards
    (csrc/api/variants.h, hopper_bwd_projects_dk): it then needs an fp32 dK and the key sums of
    every DK_KEYSUM_SLOT keys (csrc/prepost/dk_project.cuh, dk_keysum_slots)."""
    return numerics == "gproj" and os.environ.get("GPROJ_BWD_VARIANT") not in ("3", "4", "6")


def backward_cuda(dout, q, k, v, out, stats, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics,
                  dk_accum: Optional[Tensor] = None, hopper: Optional[bool] = None,
                  lazy_centering: bool = True, k_shift: Optional[Tensor] = None):
    """Kernel backward. ``dk_accum`` (fp32, k's shape, contiguous) receives dK before its final
    rounding: where SPEC.md measures the keys' common gradient. ``hopper``: see
    ``_hopper_backward``. ``lazy_centering=False`` (tests) makes the Hopper backward write and
    read K' and Q' for every (sequence, head), as the lazy default (dense inputs) must match bit
    for bit. ``k_shift`` (gproj): the forward's key shift (``forward_cuda(...,
    return_k_shift=True)``), which spares the centering its range pass over K."""
    varlen = cu_q is not None
    poison = _poison()
    dq = _new(q.shape, q.dtype, q.device, poison)
    dk = _new(k.shape, k.dtype, k.device, poison)
    dv = _new(v.shape, v.dtype, v.device, poison)
    if _empty_problem(q, k):
        for t in (dq, dk, dv):
            t.zero_()
        if dk_accum is not None:
            dk_accum.zero_()
        return dq, dk, dv
    q, k, v, out, dout = (_kernel_ready(t) for t in (q, k, v, out, dout))
    q_shift = q_centered = k_centered = k_flags = q_flags = None
    hopper = _hopper_backward(q, numerics, hopper)
    if numerics == "gproj" and hopper:
        # Lazy, as in the forward: K' and Q' are written only for the (sequence, head) pairs with
        # a nonzero shift, and the kernels read the user's K and Q elsewhere (equal bit for bit).
        # Random or zero-mean inputs then cost one read of K and Q instead of two reads and a write.
        # Dense only: a varlen tile's last rows are the next sequence's, and the dQ and dK GEMMs
        # multiply them by dS~ = 0, which gives NaN where K' or Q' was left unwritten (garbage);
        # the forward only masks scores there, so it stays lazy for varlen too.
        if lazy_centering and not varlen:
            k_flags = torch.empty(k.shape[0], k.shape[-2], dtype=torch.int32, device=k.device)
            q_flags = torch.empty(q.shape[0], q.shape[-2], dtype=torch.int32, device=q.device)
        k_centered, _ = center_keys_cuda(k, cu_k, max_k, flags=k_flags, shift=k_shift)
        if q.shape[-1] == 256:  # Q' = Q - q_shift made in shared memory (bwd_kv_split_sm90.cuh)
            q_flags = None
            _, q_shift = center_keys_cuda(q, cu_q, max_q, shift_only=True, approx=True)
        else:  # Q' = Q - q_shift, the dK GEMM's operand (loaded by TMA in the KV-outer pass)
            q_centered, q_shift = center_keys_cuda(q, cu_q, max_q, flags=q_flags, approx=True)
    elif numerics == "gproj":
        k, _ = center_keys_cuda(k, cu_k, max_k, shift=k_shift)  # the forward's exact shift
        _, q_shift = center_keys_cuda(q, cu_q, max_q, shift_only=True,  # (dK GEMM, in the kernel)
                                      approx=True)
    # {delta, lambda hi, lambda lo, delta + lambda} per row: dQ pass -> dK/dV pass (params.h)
    rowstate = torch.empty(stats.shape[:-1] + (4,), dtype=torch.float32, device=q.device)
    p = _params(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics)
    p.stats, p.rowstate = stats.data_ptr(), rowstate.data_ptr()
    if q_shift is not None:
        p.q_shift = q_shift.data_ptr()
    p.out, p.o_stride = out.data_ptr(), _strides3(out, varlen)
    p.dout, p.do_stride = dout.data_ptr(), _strides3(dout, varlen)
    p.dq, p.dq_stride = dq.data_ptr(), _strides3(dq, varlen)
    p.dk, p.dk_stride = dk.data_ptr(), _strides3(dk, varlen)
    p.dv, p.dv_stride = dv.data_ptr(), _strides3(dv, varlen)
    if dk_accum is not None:
        assert dk_accum.shape == k.shape and dk_accum.dtype == torch.float32
        assert dk_accum.stride() == dk.stride()
        p.dk_accum = dk_accum.data_ptr()
    if hopper:
        # fa3 (and gproj variant 4) sum dQ over key tiles in fp32: tiled, per head, 64-row tiles,
        # each sequence starting a fresh one (csrc/common/tile.cuh). gproj's Q-outer pass writes
        # dQ itself (csrc/api/variants.h, hopper_bwd_uses_dq_accum).
        if _reduce_adds_dq(numerics, q.shape[-1]):
            rows = q.shape[0] if varlen else q.shape[0] * q.shape[1]
            # (fa3 mode's d = 128 variant 39: 80-row tiles, the same padding rule)
            tile_rows = (64, 80) if p.head_dim == 128 else (64,)
            tiles_x_rows = max((rows + r * p.batch + r - 1) // r * r for r in tile_rows)
            # (zero-filled by the pre-pass that reads the same rows first: the delta kernel in
            # fa3 mode, the λ pre-pass in gproj mode)
            n_acc = p.heads * tiles_x_rows * p.head_dim
            dq_accum = _new((n_acc,), torch.float32, q.device, poison)
            p.dq_accum = dq_accum.data_ptr()
        if numerics == "gproj":
            p.k_centered, p.kc_stride = k_centered.data_ptr(), _strides3(k_centered, varlen)
            if q_centered is not None:
                p.q_centered, p.qc_stride = q_centered.data_ptr(), _strides3(q_centered, varlen)
            if k_flags is not None:
                p.k_center_flags = k_flags.data_ptr()
            if q_flags is not None:
                p.q_center_flags = q_flags.data_ptr()
        if _projects_dk(numerics):
            # fp32 dK before the projection (in the caller's dk_accum when given: it then
            # receives the projected values) and the fp64 key sums of every DK_KEYSUM_SLOT keys.
            unprojected = (dk_accum if dk_accum is not None else
                           torch.empty(dk.shape, dtype=torch.float32, device=q.device))
            p.dk_unprojected = unprojected.data_ptr()
            slots = (p.seqlen_k + DK_KEYSUM_SLOT - 1) // DK_KEYSUM_SLOT
            keysum = torch.empty(p.batch * p.heads_k * slots * (p.head_dim + 1),
                                 dtype=torch.float64, device=q.device)
            p.dk_keysum = keysum.data_ptr()
        splits = _kv_head_splits(numerics, q, k, varlen, causal_like=wr >= 0)
        if splits > 1:  # (zeroed by the pre-pass that writes rowstate, pair by pair)
            p.kv_head_splits = splits
            p.dkv_accum_bytes = _dkv_accum_bytes(p)
            dkv_accum = _new((p.dkv_accum_bytes // 4,), torch.float32, q.device, poison)
            p.dkv_accum = dkv_accum.data_ptr()
        # two per (sequence, kv head): the rows and keys each pass has finished, which the next
        # pass, started under its last wave, waits for (csrc/api/params.h, csrc/common/pdl.cuh);
        # the launch zeroes them
        counters = torch.empty(2 * p.batch * p.heads_k, dtype=torch.int32, device=q.device)
        p.pair_counters = counters.data_ptr()
        p.backward_passes = 8
        _ext.extension().backward(p)
        return dq, dk, dv
    _ext.extension().backward(p)
    return dq, dk, dv


def rowstate_cuda(q, k, v, out, stats, dout, scale, wl, wr, passes=4):
    """The backward's per-row state {delta, lambda hi, lambda lo, -} (gproj, dense) from one pass
    alone, on the same exactly centered keys as the backward: the Hopper λ pre-pass
    (``passes=4``) or the mma.sync dQ pass (``passes=1``). For tests and timing; rows the pass
    leaves unwritten stay NaN."""
    kc, _ = center_keys_cuda(k, None, k.shape[1])
    p = _params(q, kc, v, None, None, q.shape[1], k.shape[1], scale, wl, wr, "gproj")
    rowstate = torch.full(stats.shape[:-1] + (4,), float("nan"), device=q.device)
    dq = torch.empty_like(q)  # the dQ pass writes it; the pre-pass does not touch it
    p.stats, p.rowstate = stats.data_ptr(), rowstate.data_ptr()
    p.out, p.o_stride = out.data_ptr(), _strides3(out, False)
    p.dout, p.do_stride = dout.data_ptr(), _strides3(dout, False)
    p.dq, p.dq_stride = dq.data_ptr(), _strides3(dq, False)
    p.backward_passes = passes
    _ext.extension().backward(p)
    return rowstate


# --------------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("gproj::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: float, window_left: int, window_right: int,
              numerics: str, deterministic: bool = False
              ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention forward. Returns (out, lse, stats, k_shift); see the module docstring.
    ``deterministic`` only travels to the backward (which then never takes a path with
    atomics)."""
    return _attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              softmax_scale, window_left, window_right, numerics)


def _attention_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       softmax_scale, window_left, window_right, numerics):
    """The forward op's body (also ``call_attention``'s eager path)."""
    if q.device.type == "cpu":
        # The emulator's fp32 steps are part of the arithmetic it reproduces: a caller's autocast
        # region must not turn them into BF16 matmuls.
        with torch.autocast("cpu", enabled=False):
            res = emulate_forward(q, k, v, numerics=numerics, softmax_scale=softmax_scale,
                                  window_size=(window_left, window_right),
                                  cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
        return tuple(res) + (k.new_empty(_shift_shape(q, k, cu_seqlens_k, numerics)),)
    out, lse, stats, shift = forward_cuda(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                          max_seqlen_k, softmax_scale, window_left, window_right,
                                          numerics, return_k_shift=True)
    if shift is None:  # fa3 mode (empty), or an empty problem (no centering ran, none will)
        shift = k.new_zeros(_shift_shape(q, k, cu_seqlens_k, numerics))
    return out, lse, stats, shift


def _shift_shape(q, k, cu_k, numerics):
    """The forward op's k_shift: the centering's shift where the backward can take it (gproj on
    CUDA), else empty."""
    return _k_shift_shape(k, cu_k) if numerics == "gproj" and q.device.type == "cuda" else (0,)


@attention.register_fake
def _attention_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    softmax_scale, window_left, window_right, numerics, deterministic=False):
    rs = _rowstat_shape(q, cu_seqlens_q is not None, q.shape[-2])
    return (q.new_empty(q.shape), q.new_empty(rs, dtype=torch.float32),
            q.new_empty(tuple(rs) + (2,), dtype=torch.float32),
            k.new_empty(_shift_shape(q, k, cu_seqlens_k, numerics)))


@torch.library.custom_op("gproj::attention_backward", mutates_args=())
def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                       stats: Tensor, cu_seqlens_q: Optional[Tensor],
                       cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                       softmax_scale: float, window_left: int, window_right: int,
                       numerics: str, deterministic: bool = False,
                       k_shift: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Attention backward from the forward's out and stats. Returns (dq, dk, dv).
    ``deterministic=True`` keeps off the Hopper backward where its dQ is summed by reduce-adds
    in varying order (fa3 mode; gproj's GPROJ_BWD_VARIANT=4); gproj's default Hopper backward
    has a fixed order and stays on. ``k_shift``: the forward op's fourth output (empty or None:
    the backward finds the shift itself)."""
    return _attention_backward(dout, q, k, v, out, stats, cu_seqlens_q, cu_seqlens_k,
                               max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
                               window_right, numerics, deterministic, k_shift)


def _attention_backward(dout, q, k, v, out, stats, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                        max_seqlen_k, softmax_scale, window_left, window_right, numerics,
                        deterministic=False, k_shift=None):
    """The backward op's body (also ``call_attention``'s eager path)."""
    if q.device.type == "cpu":
        with torch.autocast("cpu", enabled=False):
            return emulate_backward(dout, q, k, v, out, stats, numerics=numerics,
                                    softmax_scale=softmax_scale,
                                    window_size=(window_left, window_right),
                                    cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return backward_cuda(dout, q, k, v, out, stats, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, softmax_scale, window_left, window_right, numerics,
                         hopper=False if deterministic and _reduce_adds_dq(numerics, q.shape[-1])
                         else None,
                         k_shift=k_shift if k_shift is not None and k_shift.numel() else None)


@attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, stats, cu_seqlens_q, cu_seqlens_k,
                             max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
                             window_right, numerics, deterministic=False, k_shift=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics = inputs[:11]
    deterministic = bool(inputs[11]) if len(inputs) > 11 else False
    out, lse, stats, k_shift = output
    ctx.save_for_backward(q, k, v, out, stats, cu_q, cu_k, k_shift)
    ctx.args = (max_q, max_k, scale, wl, wr, numerics, deterministic)
    ctx.mark_non_differentiable(lse, stats, k_shift)


def _input_grads(ctx, dout, run_backward):
    """The forward's input gradients from what _setup_context saved, by ``run_backward`` (the
    backward op, or its body in the eager path)."""
    q, k, v, out, stats, cu_q, cu_k, k_shift = ctx.saved_tensors
    dq, dk, dv = run_backward(dout, q, k, v, out, stats, cu_q, cu_k, *ctx.args, k_shift)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


def _backward(ctx, dout, _dlse, _dstats, _dshift):
    return _input_grads(ctx, dout, torch.ops.gproj.attention_backward)


attention.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------------------------
# The user API's entry: the op, or in plain eager mode the same bodies without its dispatch
# --------------------------------------------------------------------------------------------

# False: every call through torch.ops.gproj.attention (tests compare the two paths).
EAGER_FAST_PATH = True


class _AttentionFunction(torch.autograd.Function):
    """The ops' forward and backward bodies as an autograd Function: what the op's autograd
    registration does (``_setup_context``, ``_backward``), without the dispatcher."""

    @staticmethod
    def forward(ctx, *inputs):  # (the forward op's 12 arguments)
        output = _attention_forward(*inputs[:11])
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse, _dstats, _dshift):
        return _input_grads(ctx, dout, _attention_backward)


def _plain_eager(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether a call may skip the op: not under torch.compile or torch.jit tracing (both must
    see the op), no Python dispatch mode (fake tensors, flop counters, selective checkpointing,
    ...), no functorch transform, and plain CPU or CUDA tensors (not subclasses)."""
    return (EAGER_FAST_PATH and type(q) is Tensor and type(k) is Tensor and type(v) is Tensor
            and q.device.type in ("cuda", "cpu") and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing() and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active())


def call_attention(q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics, deterministic):
    """(out, lse, stats, k_shift) as ``torch.ops.gproj.attention`` returns them, with autograd,
    by the cheapest path that keeps its semantics (module docstring)."""
    args = (q, k, v, cu_q, cu_k, max_q, max_k, scale, wl, wr, numerics, bool(deterministic))
    if not _plain_eager(q, k, v):
        return torch.ops.gproj.attention(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _AttentionFunction.apply(*args)
    return _attention_forward(*args[:11])
