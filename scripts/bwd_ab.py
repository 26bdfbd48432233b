"""Backward A/B with little noise: cuDNN's backward, fa3 mode and gproj's backward variants
(GPROJ_BWD_VARIANT, read at every call), interleaved call by call in one process so that drift
hits every candidate alike. Prints the median time of each and its ratio to cuDNN's time
(gproj's bar: <= 1.6x), then, with KERNELS=1, each candidate's time per kernel (torch profiler).
cuDNN's time here reads 10-40% above bench/speed.py's for the same shape (measured 2026-11-29:
1.76 vs 1.43 ms at d=128 N=2k), interleaved with our calls; so compare our candidates with each
other here, and take ratios to cuDNN from speed.py.
Usage: python scripts/bwd_ab.py VARIANTS [d,N[,causal][,gqa] ...]   e.g.  0,4  128,2048 64,16384,causal
AB_ENV=NAME makes VARIANTS values of that switch instead (e.g. AB_ENV=GPROJ_TILE_ORDER 0,2).
AB_LIB=PATH adds "fa3 lib" and "gproj lib": the same backward through another build of the
extension (e.g. the previous commit's .so), with its own forward's softmax state.
AB_FA3_VARIANTS=0,9 runs fa3 mode with those GPROJ_BWD_VARIANT values (default: 0 only); a value
VsS (e.g. 20s2) also sets GPROJ_BWD_KV_SPLITS=S for its calls (fa3 mode's GQA group in S shares).
AB_FA3_BWD=DIR adds "FA3": FlashAttention-3's own backward, built from its upstream source as a
standalone library (DIR holds its ctypes wrapper fa3bwd.py and libfa3bwd.so; bench/fa3_bwd/README.md
says how to build it), fed by FlashAttention-3's forward wheel (flash_attn_interface) on the same
inputs, or where the wheel is not importable by our fa3 mode's forward. (Dense batches only.)
The backward gets the forward's key shift, as the ops hand it over; AB_NO_SHIFT=1 makes it find
the shift itself."""
import os
import sys

import torch
import torch.nn.functional as F
from _timing import Case, interleaved, with_library

from gproj_cuda.ops import backward_cuda, forward_cuda


def candidates(c, variants, lib=None, fa3_variants=("0",)):
    n, s, wr = c.n, c.scale, c.window_right
    q, k, v = c.q, c.k, c.v
    do = torch.randn_like(q)
    # cuDNN's backward as bench/speed.py times it: leaves in (B, N, H, d), SDPA on transposed
    # views, out.backward(do) (torch.autograd.grad on transposed leaves cost ~0.3 ms more per call)
    ql, kl, vl = (x.detach().requires_grad_() for x in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
        ot = F.scaled_dot_product_attention(ql.transpose(1, 2), kl.transpose(1, 2),
                                            vl.transpose(1, 2), is_causal=c.causal,
                                            enable_gqa=c.gqa).transpose(1, 2)

    def cudnn_bwd():
        ql.grad = kl.grad = vl.grad = None
        ot.backward(do, retain_graph=True)
    cands = [("cudnn", None, cudnn_bwd)]
    for m in ("fa3", "gproj"):
        # as the ops run them: the forward's key shift handed to the backward (AB_NO_SHIFT=1:
        # the backward finds it itself, as before session 11)
        out, _, st, ks = forward_cuda(q, k, v, None, None, n, n, s, -1, wr, m, return_k_shift=True)
        if os.environ.get("AB_NO_SHIFT") == "1":
            ks = None
        for tok in (fa3_variants if m == "fa3" else variants):
            # "VsS": variant V with GPROJ_BWD_KV_SPLITS=S (fa3 mode's split GQA group)
            var, _, splits = tok.partition("s")
            cands.append((f"{m} v{tok}", var,
                          lambda m=m, out=out, st=st, ks=ks, splits=splits: with_splits(
                              splits, lambda: backward_cuda(do, q, k, v, out, st, None, None, n,
                                                            n, s, -1, wr, m, hopper=True,
                                                            k_shift=ks))))
        if lib:
            out_l, _, st_l = lib(forward_cuda)(q, k, v, None, None, n, n, s, -1, wr, m)
            var = (fa3_variants if m == "fa3" else variants)[0]
            cands.append((f"{m} lib", var, lib(lambda m=m, out=out_l, st=st_l: backward_cuda(
                do, q, k, v, out, st, None, None, n, n, s, -1, wr, m, hopper=True))))
    if os.environ.get("AB_FA3_BWD") and not c.varlen_mean:
        fa3_bwd = load_fa3_backward(os.environ["AB_FA3_BWD"])
        out_f, lse_f = fa3_forward_for_backward(q, k, v, s, c.causal)
        cands.append(("FA3", None, lambda: fa3_bwd.backward(q, k, v, out_f, do, lse_f, c.causal, s)))
    return cands


def with_splits(splits, fn):
    """fn() with GPROJ_BWD_KV_SPLITS=splits ("" : unset), restored after."""
    old = os.environ.pop("GPROJ_BWD_KV_SPLITS", None)
    if splits:
        os.environ["GPROJ_BWD_KV_SPLITS"] = splits
    try:
        return fn()
    finally:
        os.environ.pop("GPROJ_BWD_KV_SPLITS", None)
        if old is not None:
            os.environ["GPROJ_BWD_KV_SPLITS"] = old


def fa3_forward_for_backward(q, k, v, scale, causal):
    """(out, lse) for FlashAttention-3's backward: its forward wheel's (flash_attn_interface) or,
    where that is not importable (too large to carry beside two builds of ours), our fa3 mode's
    forward, FlashAttention-3's arithmetic, whose lse has the same meaning and layout (natural
    log, (B, H, N) fp32). Dense batches."""
    try:
        import flash_attn_interface
    except ImportError:
        n = q.shape[1]
        out, lse, _ = forward_cuda(q, k, v, None, None, n, n, scale, -1, 0 if causal else -1,
                                   "fa3")
        return out, lse
    return flash_attn_interface._flash_attn_forward(q, k, v, softmax_scale=scale,
                                                     causal=causal)[:2]


def load_fa3_backward(path):
    """FlashAttention-3's backward wrapper module (fa3bwd.py) from the folder ``path``."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fa3bwd", os.path.join(path, "fa3bwd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    variants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["0"]
    shapes = sys.argv[2:] or ["64,2048", "64,16384", "128,2048", "128,2048,causal", "128,16384",
                              "128,16384,causal"]
    reps = int(os.environ.get("AB_REPS", "15"))
    lib = with_library(os.environ["AB_LIB"]) if os.environ.get("AB_LIB") else None
    fa3_variants = os.environ.get("AB_FA3_VARIANTS", "0").split(",")
    names = ([f"fa3 v{v}" for v in fa3_variants] + (["fa3 lib"] if lib else [])
             + [f"gproj v{v}" for v in variants]
             + (["gproj lib"] if lib else []) + (["FA3"] if os.environ.get("AB_FA3_BWD") else []))
    print(f"{'d':>4} {'N':>6} {'mask':>11} | {'cuDNN ms':>8} | " +
          " ".join(f"{x:>15}" for x in names) + "   (time, then cuDNN time / time)")
    for a in shapes:
        c = Case.parse(a)
        cands = candidates(c, variants, lib, fa3_variants)
        med = interleaved(cands, os.environ.get("AB_ENV", "GPROJ_BWD_VARIANT"), reps)
        base = med["cudnn"]
        print(f"{c.d:4d} {c.n:6d} {c.mask:>11} | {base:8.3f} | " +
              " ".join(f"{med[name]:7.3f} {base / med[name]:5.3f}x" for name, _, _ in cands[1:]),
              flush=True)
        if os.environ.get("KERNELS") == "1":
            for name, var, fn in cands:
                os.environ[os.environ.get("AB_ENV", "GPROJ_BWD_VARIANT")] = var or "0"
                fn()
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn()
                    torch.cuda.synchronize()
                per = {}
                for e in prof.events():
                    if e.device_type == torch.autograd.DeviceType.CUDA:
                        per[e.name] = per.get(e.name, 0.0) + e.device_time / 5 / 1000
                top = sorted(per.items(), key=lambda kv: -kv[1])[:6]
                print(f"    {name:10s} " + "; ".join(f"{kn[:48]} {ms:.3f}" for kn, ms in top))
    os.environ[os.environ.get("AB_ENV", "GPROJ_BWD_VARIANT")] = "0"


if __name__ == "__main__":
    main()
