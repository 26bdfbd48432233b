"""The float64 reference against autograd, for every mask and layout it supports."""

import math

import pytest
import torch

from gproj_cuda import reference
from gproj_cuda.masks import visible


def autograd_attention(q, k, v, do, *, causal, window, scale):
    """Textbook attention in float64 with torch autograd (dense layout, per batch)."""
    q, k, v = (t.double().detach().requires_grad_() for t in (q, k, v))
    g = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(g, 2)
    vv = v.repeat_interleave(g, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) * scale
    left, right = window
    if causal:
        right = 0
    keep = visible(q.shape[1], k.shape[1], left, right)
    s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = torch.einsum("bhij,bjhd->bihd", p, vv)
    o.backward(do.double())
    return o.detach(), q.grad, k.grad, v.grad


CASES = [
    dict(nq=37, nk=37, h=2, hk=2, causal=False, window=(-1, -1)),
    dict(nq=37, nk=53, h=4, hk=2, causal=True, window=(-1, -1)),
    dict(nq=53, nk=37, h=4, hk=1, causal=True, window=(-1, -1)),   # first rows see no key
    dict(nq=40, nk=40, h=2, hk=2, causal=False, window=(5, 3)),
    dict(nq=40, nk=64, h=2, hk=1, causal=True, window=(7, -1)),
]


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_autograd(case, rng):
    d = 64
    q = torch.randn(2, case["nq"], case["h"], d, generator=rng).bfloat16()
    k = torch.randn(2, case["nk"], case["hk"], d, generator=rng).bfloat16()
    v = torch.randn(2, case["nk"], case["hk"], d, generator=rng).bfloat16()
    do = torch.randn(2, case["nq"], case["h"], d, generator=rng).bfloat16()
    scale = 0.11
    out, lse, dq, dk, dv = reference.attention_grads(q, k, v, do, causal=case["causal"],
                                                     softmax_scale=scale,
                                                     window_size=case["window"])
    ao, adq, adk, adv = autograd_attention(q, k, v, do, causal=case["causal"],
                                           window=case["window"], scale=scale)
    for a, b in ((out, ao), (dq, adq), (dk, adk), (dv, adv)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # LSE: logsumexp of the visible scaled scores (+inf where a row sees nothing).
    g = case["h"] // case["hk"]
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(g, 2)) * scale
    left, right = case["window"]
    keep = visible(case["nq"], case["nk"], left, 0 if case["causal"] else right)
    ref_lse = torch.logsumexp(s.masked_fill(~keep, -math.inf), -1)
    ref_lse = torch.where(torch.isinf(ref_lse), torch.full_like(ref_lse, math.inf), ref_lse)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    assert (out.abs().sum() > 0) and torch.isfinite(out).all()


def test_varlen_equals_per_sequence(rng):
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 33, 0]
    d, h, hk = 64, 4, 2
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, generator=rng).bfloat16()
    k = torch.randn(sum(lens_k), hk, d, generator=rng).bfloat16()
    v = torch.randn(sum(lens_k), hk, d, generator=rng).bfloat16()
    do = torch.randn(sum(lens_q), h, d, generator=rng).bfloat16()
    out, lse, dq, dk, dv = reference.attention_grads(q, k, v, do, causal=True,
                                                     cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    for b in range(len(lens_q)):
        qs, qe, ks, ke = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if qe == qs:
            continue
        o1, l1, dq1, dk1, dv1 = reference.attention_grads(
            q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], do[None, qs:qe], causal=True)
        torch.testing.assert_close(out[qs:qe], o1[0])
        torch.testing.assert_close(lse[:, qs:qe], l1[0])
        torch.testing.assert_close(dq[qs:qe], dq1[0])
        torch.testing.assert_close(dk[ks:ke], dk1[0])
        torch.testing.assert_close(dv[ks:ke], dv1[0])
    # sequence 3 has no keys: zero output, +inf lse
    assert (out[cu_q[3]:cu_q[4]] == 0).all() and torch.isinf(lse[:, cu_q[3]:cu_q[4]]).all()
