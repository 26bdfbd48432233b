"""Every bad input gets a clear error naming the argument (CPU tensors: runs without a GPU)."""

import pytest
import torch

import gproj_cuda


def qkv(b=1, n=16, h=2, hk=2, d=64, dtype=torch.bfloat16):
    return (torch.randn(b, n, h, d).to(dtype), torch.randn(b, n, hk, d).to(dtype),
            torch.randn(b, n, hk, d).to(dtype))


def test_happy_path_runs_on_cpu_emulator():
    q, k, v = qkv()
    out, lse = gproj_cuda.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 16) and torch.isfinite(out.float()).all()


@pytest.mark.parametrize("bad,exc,match", [
    (lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, "bfloat16 or torch.float16"),
    (lambda q, k, v: (q, k.half(), v), TypeError, "share one dtype"),
    (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dimensions"),
    (lambda q, k, v: (q, k[:, :8], v), ValueError, "k and v must have the same shape"),
    (lambda q, k, v: (q[..., :32], k[..., :32], v[..., :32]), ValueError, "head_dim 32"),
    (lambda q, k, v: (q, k[..., :32], v[..., :32]), ValueError, "share head_dim"),
    (lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), ValueError,
     "contiguous in its last"),
    (lambda q, k, v: (torch.cat([q, q], 0), k, v), ValueError, "batch size"),
    (lambda q, k, v: (torch.cat([q, q[:, :, :1]], 2), k, v), ValueError, "multiple of heads_k"),
    (lambda q, k, v: (q.numpy() if False else "q", k, v), TypeError, "q must be a torch.Tensor"),
])
def test_bad_tensors(bad, exc, match):
    q, k, v = bad(*qkv())
    with pytest.raises(exc, match=match):
        gproj_cuda.attention(q, k, v)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(numerics="fp32"), ValueError, "numerics must be one of"),
    (dict(window_size=(-2, 0)), ValueError, "window_size entries must be >= -1"),
    (dict(window_size=(1,)), ValueError, "pair of ints"),
    (dict(softmax_scale=0.0), ValueError, "softmax_scale must be finite and > 0"),
    (dict(softmax_scale=float("nan")), ValueError, "softmax_scale"),
    (dict(softmax_scale="big"), TypeError, "softmax_scale"),
    (dict(causal=1), TypeError, "causal must be a bool"),
])
def test_bad_arguments(kw, exc, match):
    q, k, v = qkv()
    with pytest.raises(exc, match=match):
        gproj_cuda.attention(q, k, v, **kw)


def test_device_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="one device"):
        gproj_cuda.attention(q, k.to("meta"), v)


def varlen_inputs():
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    q = torch.randn(12, 2, 64).bfloat16()
    return q, q.clone(), q.clone(), cu


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda cu: cu.long(), TypeError, "torch.int32"),
    (lambda cu: cu[None], ValueError, "1-D"),
    (lambda cu: cu[:1], ValueError, "batch \\+ 1 >= 2"),
    (lambda cu: torch.tensor([1, 5, 5, 12], dtype=torch.int32), ValueError, r"\[0\] must be 0"),
    (lambda cu: torch.tensor([0, 6, 5, 12], dtype=torch.int32), ValueError, "non-decreasing"),
    (lambda cu: torch.tensor([0, 5, 5, 13], dtype=torch.int32), ValueError, "exceeds the 12 rows"),
    (lambda cu: cu.to("meta"), ValueError, "must be on cpu"),
])
def test_bad_cu_seqlens(mutate, exc, match):
    q, k, v, cu = varlen_inputs()
    with pytest.raises(exc, match=match):
        gproj_cuda.attention_varlen(q, k, v, mutate(cu), cu, 7, 7)


def test_cu_seqlens_values_read_once_and_again_after_an_inplace_write(monkeypatch):
    """The value checks read a cu_seqlens tensor once (a device sync on CUDA); the same tensor
    object again is checked against the recorded values, and an in-place write (through any
    view) makes them be read again."""
    from gproj_cuda import validation
    _, _, _, cu = varlen_inputs()
    reads = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or tolist(t))

    def check(total=12, max_q=7):
        validation.check_cu_seqlens(cu, cu, total, 12, max_q, 7, cu.device)

    check()
    assert len(reads) == 1  # one tensor passed as both cu_seqlens_q and cu_seqlens_k
    check()
    assert len(reads) == 1, "an unmodified, already checked cu_seqlens was read again"
    # the recorded values still decide: max_seqlen below the longest length, fewer rows
    with pytest.raises(ValueError, match="max_seqlen_q = 6 is smaller"):
        check(max_q=6)
    with pytest.raises(ValueError, match="exceeds the 11 rows"):
        check(total=11)
    assert len(reads) == 1
    cu[1:2].fill_(6)  # through a view: [0, 6, 5, 12]
    with pytest.raises(ValueError, match="non-decreasing"):
        check()
    cu[1] = 5
    check()
    key = id(cu)
    assert key in validation._CU_CHECKED
    del cu
    import gc
    gc.collect()
    assert key not in validation._CU_CHECKED, "a freed tensor's entry was kept"


def test_max_seqlen_too_small_and_length_mismatch():
    q, k, v, cu = varlen_inputs()
    with pytest.raises(ValueError, match="max_seqlen_q = 6 is smaller"):
        gproj_cuda.attention_varlen(q, k, v, cu, cu, 6, 7)
    with pytest.raises(ValueError, match="same length"):
        gproj_cuda.attention_varlen(q, k, v, cu, cu[:3], 7, 7)
    with pytest.raises(ValueError, match="non-negative int"):
        gproj_cuda.attention_varlen(q, k, v, cu, cu, -1, 7)
    with pytest.raises(ValueError, match="3 dimensions"):
        gproj_cuda.attention_varlen(q[None], k, v, cu, cu, 7, 7)


def test_flash_attn_drop_in_rejects_unsupported():
    q, k, v = qkv()
    for kw in (dict(softcap=30.0), dict(qv=q), dict(q_descale=torch.ones(1)), dict(num_splits=2),
               dict(attention_chunk=128)):
        with pytest.raises(NotImplementedError, match="not supported"):
            gproj_cuda.flash_attn_func(q, k, v, **kw)
    q2, k2, v2, cu = varlen_inputs()
    with pytest.raises(NotImplementedError, match="seqused_k"):
        gproj_cuda.flash_attn_varlen_func(q2, k2, v2, cu, cu, 7, 7, seqused_k=cu)


def test_flash_attn_drop_in_matches_api():
    q, k, v = qkv()
    a = gproj_cuda.flash_attn_func(q, k, v, causal=True, pack_gqa=True, sm_margin=4)
    b = gproj_cuda.attention(q, k, v, causal=True)
    assert torch.equal(a, b)
    out, lse = gproj_cuda.flash_attn_func(q, k, v, return_attn_probs=True)
    assert lse.shape == (1, 2, 16)


def test_is_available_explains():
    if not gproj_cuda.is_available():
        reason = gproj_cuda.unavailable_reason()
        assert isinstance(reason, str) and len(reason) > 20
    else:
        assert gproj_cuda.unavailable_reason() is None


def test_center_keys_counter_needs_the_range_pass():
    """The tile counter that the centering pass hands the forward is zeroed by its range pass's
    memset, which a given shift skips: asking for both is refused before anything launches."""
    from gproj_cuda.ops import center_keys_cuda
    _, k, _ = qkv()
    with pytest.raises(ValueError, match="counter=True needs the range pass"):
        center_keys_cuda(k, None, k.shape[1], shift=torch.zeros(1, 2, 64).to(k.dtype), counter=True)


def test_c_api_refuses_a_batch_stride_on_varlen_tensors():
    """The C API's varlen tensors are rows packed over the batch and found through cu_seqlens,
    with batch stride 0 (csrc/api/params.h): the kernels still add the batch entry times it, so
    any other value addressed the wrong rows (and, since session 43's 16-byte stores, may fault).
    The validation refuses it by name before anything touches a device, so this runs without a
    GPU (the pointers are never dereferenced)."""
    from gproj_cuda import _ext
    try:
        ext = _ext.extension()
    except Exception as e:  # (a machine without the compiled extension)
        pytest.skip(f"the CUDA extension is not built: {e}")
    p = ext.Params()
    p.dtype, p.numerics, p.head_dim = 0, 1, 64
    p.batch, p.heads, p.heads_k, p.seqlen_q, p.seqlen_k = 2, 2, 2, 16, 16
    p.total_q = p.total_k = 32
    p.softmax_scale = 0.125
    p.cu_seqlens_q, p.cu_seqlens_k = 1 << 20, (1 << 20) + 64
    p.q, p.k, p.v = 1 << 24, 2 << 24, 3 << 24
    p.k_stride = p.v_stride = [0, 128, 64]
    for bad in ([8, 128, 64], [-8, 128, 64]):
        p.q_stride = bad
        with pytest.raises(ValueError, match="q: varlen tensors take batch stride 0"):
            ext.forward(p)
    p.q_stride = [0, 128, 64]
    p.k_stride = [4096, 128, 64]
    with pytest.raises(ValueError, match="k: varlen tensors take batch stride 0"):
        ext.forward(p)
