"""ctypes wrapper around libfa3bwd.so (FlashAttention-3 Hopper backward, built standalone).

backward(q, k, v, out, dout, lse, causal, softmax_scale) -> (dq, dk, dv)
  q, out, dout: (b, sq, h, d) bf16 CUDA, contiguous;  k, v: (b, sk, hk, d);  lse: (b, h, sq) fp32.
Importing this module does not touch CUDA or load the library (lazy load on first call).
"""
import ctypes
import os

_LIB = None
_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libfa3bwd.so")
_NUM_WS = 6  # lse_log2, dsoftmax_sum, dq_accum, dk_accum, dv_accum, dq_semaphore


def _lib():
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(_LIB_PATH)
        vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        lib.fa3_bwd.argtypes = [i, i, i, i, i, i, i] + [vp] * 15 + [f, vp]  # 6 inputs, 3 grads, 6 workspaces
        lib.fa3_bwd.restype = i
        lib.fa3_bwd_workspace_sizes_causal.argtypes = [i, i, i, i, i, i, i, ctypes.POINTER(ctypes.c_longlong)]
        lib.fa3_bwd_workspace_sizes_causal.restype = None
        lib.fa3_bwd_built.argtypes = []
        lib.fa3_bwd_built.restype = i
        _LIB = lib
    return _LIB


def built_hdims():
    m = _lib().fa3_bwd_built()
    return [d for d, bit in ((64, 1), (128, 2), (256, 4)) if m & bit], bool(m & 8)


def workspace_sizes(hdim, causal, b, sq, sk, h, hk):
    arr = (ctypes.c_longlong * _NUM_WS)()
    _lib().fa3_bwd_workspace_sizes_causal(int(hdim), int(bool(causal)), b, sq, sk, h, hk, arr)
    return [int(x) for x in arr]


def backward(q, k, v, out, dout, lse, causal, softmax_scale):
    import torch
    assert q.is_cuda and q.dtype == torch.bfloat16, "q must be a bf16 CUDA tensor"
    for t in (k, v, out, dout):
        assert t.dtype == torch.bfloat16 and t.device == q.device
    assert lse.dtype == torch.float32
    b, sq, h, d = q.shape
    _, sk, hk, _ = k.shape
    assert v.shape == k.shape and out.shape == q.shape and dout.shape == q.shape
    assert lse.shape == (b, h, sq)
    q, k, v, out, dout, lse = (t.contiguous() for t in (q, k, v, out, dout, lse))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sizes = workspace_sizes(d, causal, b, sq, sk, h, hk)
    # FA3's mha_bwd: torch::empty for everything except dk_accum / dv_accum (torch::zeros, GQA only).
    zero_filled = (False, False, False, True, True, False)
    ws = []
    for nbytes, zero in zip(sizes, zero_filled):
        if nbytes == 0:
            ws.append(None)
            continue
        alloc = torch.zeros if zero else torch.empty
        ws.append(alloc(nbytes, dtype=torch.uint8, device=q.device))
    ptr = lambda t: None if t is None else ctypes.c_void_p(t.data_ptr())
    stream = torch.cuda.current_stream(q.device).cuda_stream
    with torch.cuda.device(q.device):
        rc = _lib().fa3_bwd(
            int(d), int(bool(causal)), b, sq, sk, h, hk,
            ptr(q), ptr(k), ptr(v), ptr(out), ptr(dout), ptr(lse),
            ptr(dq), ptr(dk), ptr(dv),
            *[ptr(t) for t in ws],
            ctypes.c_float(softmax_scale), ctypes.c_void_p(stream))
    if rc != 0:
        raise RuntimeError(f"fa3_bwd failed with CUDA error code {rc} (hdim={d}, causal={causal}, h={h}, hk={hk})")
    # keep workspaces alive until the kernels using them have been enqueued-and-run on this stream
    for t in ws:
        if t is not None:
            t.record_stream(torch.cuda.current_stream(q.device))
    return dq, dk, dv
