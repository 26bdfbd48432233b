"""dK per head where a query head (and / or a kv head) carries an offset of 6 that the exact
centering leaves in place (session 17): the Hopper backward's forms (GPROJ_BWD_VARIANT 0: A in one
part + projection, 6: two parts, 3: three parts) and the mma.sync passes against float64 and the
CPU emulator (IEEE fp32 GEMMs). Usage, repo root:
PYTHONPATH=. python bench/results/session17_2026-12-01/dk_offset_diag.py"""
import math
import os

import torch

from gproj_cuda import reference
from gproj_cuda.metrics import row_rel_err
from gproj_cuda.ops import backward_cuda, forward_cuda


def dk32(q, k, v, do, variant, hopper):
    os.environ["GPROJ_BWD_VARIANT"] = variant
    s = 1 / math.sqrt(q.shape[-1])
    out, _, st = forward_cuda(q, k, v, None, None, q.shape[1], k.shape[1], s, -1, -1, "gproj")
    acc = torch.zeros(k.shape, dtype=torch.float32, device="cuda")
    backward_cuda(do, q, k, v, out, st, None, None, q.shape[1], k.shape[1], s, -1, -1, "gproj",
                  dk_accum=acc, hopper=hopper)
    torch.cuda.synchronize()
    os.environ["GPROJ_BWD_VARIANT"] = "0"
    return acc


def main():
    for d in (64, 128):
        for qoff, koff in ((6, 0), (0, 6), (6, 6), (10, 0), (3, 0)):
            g = torch.Generator(device="cuda").manual_seed(d + qoff + 7 * koff)
            q, k, v, do = (torch.randn(1, 1000, 2, d, device="cuda", generator=g) for _ in range(4))
            q[:, :, 0] += qoff
            k[:, :, 0] += koff
            q, k, v, do = (t.bfloat16() for t in (q, k, v, do))
            ref = reference.attention_grads(q, k, v, do)[3]
            res = {f"emu{a}": reference.emulate(q, k, v, do, fp32_grads=True, a_parts=a)[3]
                   for a in (1, 3)}
            res["mma.sync"] = dk32(q, k, v, do, "0", False)
            for var in ("0", "6", "3"):
                res[f"hopper v{var}"] = dk32(q, k, v, do, var, True)
            print(f"d={d} q offset {qoff} k offset {koff}: dK median row error, head 0 / head 1")
            for name, x in res.items():
                print(f"  {name:10s} " + " / ".join(
                    f"{row_rel_err(x[:, :, h], ref[:, :, h]):.3%}" for h in range(2)), flush=True)


if __name__ == "__main__":
    main()
