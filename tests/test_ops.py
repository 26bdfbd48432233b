"""torch.library integration on the CPU (emulator) path: opcheck, fake tensors, autograd,
torch.compile. The same checks run on CUDA in test_gpu.py."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gproj_cuda
from gproj_cuda import reference


def test_ops_registered():
    assert hasattr(torch.ops.gproj, "attention") and hasattr(torch.ops.gproj, "attention_backward")


def test_opcheck_cpu():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 40, 2, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))
    args = (q, k, v, None, None, 40, 40, 0.125, -1, 0, "gproj")
    torch.library.opcheck(torch.ops.gproj.attention.default, args)
    out, lse, stats, _ = torch.ops.gproj.attention(*args)
    bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), stats, None,
             None, 40, 40, 0.125, -1, 0, "gproj")
    torch.library.opcheck(torch.ops.gproj.attention_backward.default, bargs)


def test_opcheck_cpu_deterministic_argument():
    """The ops take ``deterministic`` (it selects the backward path on the GPU; the emulator
    ignores it) and autograd carries it from the forward to the backward."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 33, 2, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))
    args = (q, k, v, None, None, 33, 33, 0.125, -1, -1, "fa3", True)
    torch.library.opcheck(torch.ops.gproj.attention.default, args)
    out, lse, stats, _ = torch.ops.gproj.attention(*args)
    bargs = (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), stats, None,
             None, 33, 33, 0.125, -1, -1, "fa3", True)
    torch.library.opcheck(torch.ops.gproj.attention_backward.default, bargs)
    do = torch.randn_like(out)
    grads = []
    for det in (False, True):
        o = gproj_cuda.attention(q, k, v, numerics="fa3", deterministic=det)
        grads.append(torch.autograd.grad(o, (q, k, v), do))
    for a, b in zip(*grads):  # the emulator: the same arithmetic either way
        assert torch.equal(a, b)


def test_fake_tensor_shapes_dense_and_varlen():
    with FakeTensorMode():
        q = torch.empty(3, 100, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(3, 90, 2, 128, dtype=torch.bfloat16)
        out, lse, stats, shift = torch.ops.gproj.attention(q, k, k, None, None, 100, 90, 0.1, -1,
                                                          -1, "gproj")
        assert out.shape == q.shape and lse.shape == (3, 8, 100) and stats.shape == (3, 8, 100, 2)
        assert shift.shape == (0,)  # the key shift travels to the backward on CUDA only
        dq, dk, dv = torch.ops.gproj.attention_backward(out, q, k, k, out, stats, None, None, 100,
                                                        90, 0.1, -1, -1, "fa3")
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
        qv = torch.empty(250, 8, 64, dtype=torch.float16)
        cu = torch.empty(4, dtype=torch.int32)
        out, lse, stats, _ = torch.ops.gproj.attention(qv, qv[:, :4], qv[:, :4], cu, cu, 100,
                                                      100, 0.1, -1, 0, "fa3")
        assert out.shape == qv.shape and lse.shape == (8, 250) and stats.shape == (8, 250, 2)


def test_autograd_through_op_equals_emulator():
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(2, 50, 4, 64, generator=g).bfloat16() for _ in range(4))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out = gproj_cuda.attention(qr, kr, vr, causal=True)
    out.backward(do)
    eo, _, edq, edk, edv = reference.emulate(q, k, v, do, numerics="gproj", causal=True)
    assert torch.equal(out, eo) and torch.equal(qr.grad, edq)
    assert torch.equal(kr.grad, edk) and torch.equal(vr.grad, edv)


def test_torch_compile_fullgraph_cpu():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 32, 2, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))

    def f(q, k, v):
        return gproj_cuda.attention(q, k, v, causal=True).float().square().sum()

    eager = f(q, k, v)
    gq = torch.autograd.grad(eager, q)[0]
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    gq2 = torch.autograd.grad(compiled, q)[0]
    assert torch.equal(eager, compiled) and torch.equal(gq, gq2)


def test_cpu_op_ignores_callers_autocast():
    """Under torch.autocast the emulator must keep its fp32 steps (results bitwise unchanged)."""
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 64, 2, 64, generator=g).bfloat16() for _ in range(4))
    k = (k.float() + 30).bfloat16()
    outs = []
    for enabled in (False, True):
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            o = gproj_cuda.attention(qr, kr, vr, causal=True)
        o.backward(do)
        outs.append((o, qr.grad, kr.grad, vr.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def _grad_fn_name(t):
    return type(t.grad_fn).__name__ if t.grad_fn is not None else None


def test_eager_path_equals_the_op(monkeypatch):
    """In plain eager mode the user API skips the custom op's dispatch (ops.call_attention:
    the op's bodies through an autograd Function, or directly without grad). Outputs, LSE and
    gradients are bitwise those of the op path (ops.EAGER_FAST_PATH = False), dense and varlen,
    both numerics, with and without a mask, GQA; the eager path is the one taken (its grad_fn)."""
    from gproj_cuda import ops
    g = torch.Generator().manual_seed(5)
    cu = torch.tensor([0, 30, 31, 75], dtype=torch.int32)
    for numerics in ("gproj", "fa3"):
        for varlen in (False, True):
            if varlen:
                q = torch.randn(75, 4, 64, generator=g).bfloat16()
                k, v = (torch.randn(75, 2, 64, generator=g).bfloat16() for _ in range(2))
            else:
                q = torch.randn(2, 37, 4, 64, generator=g).bfloat16()
                k, v = (torch.randn(2, 41, 2, 64, generator=g).bfloat16() for _ in range(2))
            k = (k.float() + 20).bfloat16()  # (a key offset: the centering has work to do)
            do = torch.randn_like(q)
            runs = {}
            for fast in (True, False):
                monkeypatch.setattr(ops, "EAGER_FAST_PATH", fast)
                qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
                if varlen:
                    o, lse = gproj_cuda.attention_varlen(qr, kr, vr, cu, cu, 44, 44, causal=True,
                                                         numerics=numerics, return_lse=True)
                else:
                    o, lse = gproj_cuda.attention(qr, kr, vr, window_size=(9, 3),
                                                  numerics=numerics, return_lse=True)
                name = _grad_fn_name(o)
                grads = torch.autograd.grad(o, (qr, kr, vr), do)
                with torch.no_grad():
                    o_ng = (gproj_cuda.attention_varlen(q, k, v, cu, cu, 44, 44, causal=True,
                                                        numerics=numerics) if varlen else
                            gproj_cuda.attention(q, k, v, window_size=(9, 3), numerics=numerics))
                runs[fast] = (name, (o, lse, o_ng) + grads)
            assert runs[True][0] == "_AttentionFunctionBackward" != runs[False][0]
            for a, b in zip(runs[True][1], runs[False][1]):
                assert torch.equal(a, b)


def test_eager_path_leaves_fake_tensors_and_compile_to_the_op():
    """Under a dispatch mode (here fake tensors) the API goes through the op, whose fake
    implementation gives the shapes; under torch.compile and torch.jit.trace likewise (the
    compiled graph holds the op: test_torch_compile_fullgraph_cpu checks its values; the trace
    replays it)."""
    from gproj_cuda import ops
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 128, dtype=torch.bfloat16)
        k = torch.empty(2, 90, 2, 128, dtype=torch.bfloat16)
        assert not ops._plain_eager(q, k, k)
        out, lse = gproj_cuda.attention(q, k, k, causal=True, return_lse=True)
        assert out.shape == q.shape and lse.shape == (2, 8, 100)
    q = torch.randn(1, 16, 2, 64).bfloat16()
    assert ops._plain_eager(q, q, q)

    seen = []

    def f(q):
        seen.append(ops._plain_eager(q, q, q))
        return gproj_cuda.attention(q, q, q).float().sum()

    torch.compile(f, fullgraph=True, backend="aot_eager")(q)
    assert seen and not any(seen)
    seen.clear()
    traced = torch.jit.trace(f, (q,), check_trace=False)
    assert seen == [False] and torch.equal(traced(q), f(q))


def test_kv_head_splits_policy(monkeypatch):
    """Which calls split a kv head's group over several blocks per key tile in the Hopper
    backward (gproj_cuda.ops._kv_head_splits; csrc/api/launch.cu refuses the rest): dense GQA in
    fa3 mode (at d = 256 since session 40, not in variant 16's pass), in gproj mode at d = 256
    where GPROJ_BWD_KV_SPLITS asks (session 41); by default two shares at
    d = 128 under a causal-like mask with an even group (session 39), one block per query head
    at d = 256 (session 40), else one block per group; GPROJ_BWD_VARIANT=22: per query head;
    GPROJ_BWD_KV_SPLITS=S: S shares, S dividing the group, else a ValueError naming it; and the
    workspace's size, which the launch checks against its own (csrc/api/params.h)."""
    import pytest
    from types import SimpleNamespace
    from gproj_cuda import ops

    def shapes(h, hk, d):
        return torch.empty(2, 8, h, d), torch.empty(2, 8, hk, d)

    monkeypatch.delenv("GPROJ_BWD_VARIANT", raising=False)
    monkeypatch.delenv("GPROJ_BWD_KV_SPLITS", raising=False)
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), False) == 1
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), False, causal_like=True) == 2
    assert ops._kv_head_splits("fa3", *shapes(6, 2, 128), False, causal_like=True) == 1  # odd
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 64), False, causal_like=True) == 1
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), True, causal_like=True) == 1  # varlen
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 128), False, causal_like=True) == 1
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False) == 8  # d = 256: per query head
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False, causal_like=True) == 8
    assert ops._kv_head_splits("fa3", *shapes(8, 8, 256), False) == 1  # no GQA
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), True) == 1  # varlen
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 256), False) == 1
    # gproj at d = 256 under a causal-like mask (session 42): shares of two query heads
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 256), False, causal_like=True) == 4
    assert ops._kv_head_splits("gproj", *shapes(4, 2, 256), False, causal_like=True) == 1
    assert ops._kv_head_splits("gproj", *shapes(12, 2, 256), False, causal_like=True) == 3
    assert ops._kv_head_splits("gproj", *shapes(10, 2, 256), False, causal_like=True) == 1  # odd
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 256), True, causal_like=True) == 1
    monkeypatch.setenv("GPROJ_BWD_KV_SPLITS", "1")
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False) == 1
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), False, causal_like=True) == 1
    monkeypatch.delenv("GPROJ_BWD_KV_SPLITS")
    monkeypatch.setenv("GPROJ_BWD_VARIANT", "22")
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), False) == 8
    assert ops._kv_head_splits("fa3", *shapes(6, 2, 64), False) == 3
    assert ops._kv_head_splits("fa3", *shapes(16, 16, 128), False) == 1  # no GQA
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False) == 8   # the d = 256 pass too
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), True) == 1    # varlen
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 128), False) == 1
    monkeypatch.setenv("GPROJ_BWD_KV_SPLITS", "4")
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 128), False) == 4
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False) == 4
    # gproj: only its d = 256 pass splits the group, and only when asked (session 41)
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 256), False) == 4
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 256), True) == 1  # varlen
    assert ops._kv_head_splits("gproj", *shapes(16, 2, 128), False) == 1
    assert ops._kv_head_splits("gproj", *shapes(16, 16, 256), False) == 1  # no GQA
    monkeypatch.setenv("GPROJ_BWD_VARIANT", "16")  # (d = 256's head-dim-split pass: no split)
    assert ops._kv_head_splits("fa3", *shapes(16, 2, 256), False) == 1
    monkeypatch.setenv("GPROJ_BWD_VARIANT", "22")
    monkeypatch.setenv("GPROJ_BWD_KV_SPLITS", "3")
    with pytest.raises(ValueError, match="GPROJ_BWD_KV_SPLITS=3: must divide"):
        ops._kv_head_splits("fa3", *shapes(16, 2, 128), False)
    p = SimpleNamespace(batch=3, heads_k=2, seqlen_k=300, head_dim=64, numerics=1)
    # 3 x 2 x ceil(300 / 128) key tiles of 2 x 128 x 64 floats and one int32 counter each
    assert ops._dkv_accum_bytes(p) == 18 * (2 * 128 * 64 * 4 + 4)
    # d = 256: the transposed pass's 80-key tiles, 3 x 2 x ceil(300 / 80)
    p = SimpleNamespace(batch=3, heads_k=2, seqlen_k=300, head_dim=256, numerics=1)
    assert ops._dkv_accum_bytes(p) == 24 * (2 * 80 * 256 * 4 + 4)
    # gproj at d = 256: the head-dim-split pass's 64-key tiles, 3 x 2 x ceil(300 / 64)
    p = SimpleNamespace(batch=3, heads_k=2, seqlen_k=300, head_dim=256, numerics=0)
    assert ops._dkv_accum_bytes(p) == 30 * (2 * 64 * 256 * 4 + 4)
