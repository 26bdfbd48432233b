"""Where GPROJ_BWD_VARIANT=11's dQ (one rounded A) differs from the default's and from the
mma.sync passes', per head and row, on the test shapes of test_hopper_backward_hd256
(diagnostic, session 17; needs the build with that variant: dq_one_part_and_lazy_qc_attempt.patch).
Usage, repo root: PYTHONPATH=. python bench/results/session17_2026-12-01/dq_form_diag.py"""
import math
import os

import torch

from gproj_cuda import reference
from gproj_cuda.metrics import row_rel_err
from gproj_cuda.ops import backward_cuda, forward_cuda


def grads(q, k, v, do, causal, variant, hopper):
    os.environ["GPROJ_BWD_VARIANT"] = variant
    s = 1 / math.sqrt(q.shape[-1])
    wr = 0 if causal else -1
    out, _, st = forward_cuda(q, k, v, None, None, q.shape[1], k.shape[1], s, -1, wr, "gproj")
    dq, _, _ = backward_cuda(do, q, k, v, out, st, None, None, q.shape[1], k.shape[1], s, -1, wr,
                             "gproj", hopper=hopper)
    torch.cuda.synchronize()
    return dq


def main():
    for d in (128, 256):
        for shape in ((2, 257, 300, 4, 2), (1, 1000, 1000, 2, 2)):
            b, nq, nk, h, hk = shape
            g = torch.Generator(device="cuda").manual_seed(nq + nk + 256)
            q = torch.randn(b, nq, h, d, device="cuda", generator=g).bfloat16()
            do = torch.randn(b, nq, h, d, device="cuda", generator=g).bfloat16()
            k = torch.randn(b, nk, hk, d, device="cuda", generator=g).bfloat16()
            v = torch.randn(b, nk, hk, d, device="cuda", generator=g).bfloat16()
            k[:, :, 0] += 6
            ref = reference.attention_grads(q, k, v, do)[2]
            res = {"mma.sync": grads(q, k, v, do, False, "0", False),
                   "v0": grads(q, k, v, do, False, "0", True),
                   "v11": grads(q, k, v, do, False, "11", True)}
            os.environ["GPROJ_BWD_VARIANT"] = "0"
            print(f"d={d} shape={shape}")
            for name, x in res.items():
                err = ((x.double() - ref).norm(dim=-1) / ref.norm(dim=-1)).flatten(0, 1)  # rows
                per_head = [row_rel_err(x[:, :, i], ref[:, :, i]) for i in range(h)]
                fro = ((x.double() - res["mma.sync"].double()).norm() /
                       res["mma.sync"].double().norm()).item()
                base = res["mma.sync"].double()
                fro_h = [((x[:, :, i].double() - base[:, :, i]).norm() / base[:, :, i].norm()).item()
                         for i in range(h)]
                top = torch.topk(err.flatten(), 4)
                where = [divmod(i, h) for i in top.indices.tolist()]  # (batch * nq + row, head)
                print(f"  {name:8s} median row err {row_rel_err(x, ref):.4%}, per head "
                      + " ".join(f"{e:.3%}" for e in per_head)
                      + f" | vs mma.sync {fro:.3%}, per head " + " ".join(f"{e:.3%}" for e in fro_h)
                      + " | worst rows " + ", ".join(f"{v:.2%} at {w}" for v, w in
                                                      zip(top.values.tolist(), where)))


if __name__ == "__main__":
    main()
