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
