"""The numerics study: how far FA3's BF16 arithmetic, GProj and FP32 attention are from float64.

On a CPU-only machine it runs the emulator (``reference.emulate``), which reproduces the kernels'
arithmetic; with a GPU and the compiled extension it also runs the kernels themselves. Each grid
point is the SPEC.md section 5 stress input (q = qscale·N(0,1) + qmean·u, k = N(0,1) + kmean·w).
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field

import torch

from . import reference
from .metrics import row_rel_err, stress_inputs, sum_dk_rel

BAR_GRAD = 0.005      # gproj: median dQ/dK error (SPEC.md section 5)
BAR_SUM_DK = 1e-5     # gproj: |sum_j dK_j| / sum_j ||dK_j|| before the final store


@dataclass
class Point:
    kmean: float
    qmean: float
    qscale: float
    causal: bool
    results: dict = field(default_factory=dict)   # arm -> {o, dq, dk, dv, sum_dk}


def _arms(device: str, dtype):
    """(name, function(q, k, v, do, causal) -> (out, dq, dk_fp32_or_dtype, dv)) for each arm."""
    arms = []

    def emu(mode):
        def run(q, k, v, do, causal):
            o, _, dq, dk, dv = reference.emulate(q.cpu(), k.cpu(), v.cpu(), do.cpu(),
                                                 numerics=mode, causal=causal, fp32_grads=True)
            return o, dq, dk, dv
        return run

    def fp32(q, k, v, do, causal):
        o, _, dq, dk, dv = reference.attention_grads(q, k, v, do, causal=causal,
                                                     compute_dtype=torch.float32)
        return o, dq, dk, dv

    arms.append(("fa3 (emulated)", emu("fa3")))
    arms.append(("gproj (emulated)", emu("gproj")))
    if device == "cuda":
        from .ops import backward_cuda, forward_cuda

        def kern(mode):
            def run(q, k, v, do, causal):
                scale = 1.0 / math.sqrt(q.shape[-1])
                wl, wr = -1, (0 if causal else -1)
                out, _, stats = forward_cuda(q, k, v, None, None, q.shape[1], k.shape[1], scale,
                                             wl, wr, mode)
                dk32 = torch.empty(k.shape, dtype=torch.float32, device=k.device)
                dq, _, dv = backward_cuda(do, q, k, v, out, stats, None, None, q.shape[1],
                                          k.shape[1], scale, wl, wr, mode, dk_accum=dk32)
                return out, dq, dk32, dv
            return run

        arms.append(("fa3 (kernel)", kern("fa3")))
        arms.append(("gproj (kernel)", kern("gproj")))
    arms.append(("fp32 attention", fp32))
    return arms


def run_study(*, seqlen=512, head_dim=64, heads=2, batch=1, dtype=torch.bfloat16, device="cpu",
              kmeans=(0, 32, 256, 1024), qmeans=(0, 16), qscales=(1, 16, 32),
              causals=(False, True), seed=0, out=sys.stdout):
    """Run the grid, print a table as it goes, return the list of ``Point``."""
    with torch.no_grad():
        return _run_study(seqlen, head_dim, heads, batch, dtype, device, kmeans, qmeans, qscales,
                          causals, seed, out)


def _run_study(seqlen, head_dim, heads, batch, dtype, device, kmeans, qmeans, qscales, causals,
               seed, out):
    arms = _arms(device, dtype)
    names = [n for n, _ in arms]
    grid = list(itertools.product(causals, kmeans, qmeans, qscales))
    short = {"fa3 (emulated)": "fa3-emu", "gproj (emulated)": "gproj-emu",
             "fa3 (kernel)": "fa3-gpu", "gproj (kernel)": "gproj-gpu", "fp32 attention": "fp32"}
    hdr = f"{'causal':>6} {'kmean':>6} {'qmean':>5} {'qscale':>6} |" + "".join(
        f" {short[n] + ' dQ':>13}" for n in names) + " |" + "".join(
        f" {short[n] + ' dK':>13}" for n in names) + f" | {'gproj Σdk':>10}"
    print(f"gproj_cuda numerics study: B={batch} N={seqlen} H={heads} d={head_dim} "
          f"{str(dtype).replace('torch.', '')} on {device}; median per-row relative error vs "
          f"float64 (SPEC.md section 5)", file=out)
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    points = []
    t0 = time.time()
    for idx, (causal, km, qm, qs) in enumerate(grid):
        q, k, v, do = stress_inputs(batch, seqlen, heads, head_dim, kmean=km, qmean=qm,
                                    qscale=qs, dtype=dtype, device=device, seed=seed + idx)
        ref_o, _, ref_dq, ref_dk, ref_dv = reference.attention_grads(q, k, v, do, causal=causal)
        pt = Point(km, qm, qs, causal)
        for name, fn in arms:
            o, dq, dk, dv = fn(q, k, v, do, causal)
            pt.results[name] = dict(o=row_rel_err(o, ref_o), dq=row_rel_err(dq, ref_dq),
                                    dk=row_rel_err(dk, ref_dk), dv=row_rel_err(dv, ref_dv),
                                    sum_dk=sum_dk_rel(dk), nan=bool(torch.isnan(o).any()))
        points.append(pt)
        gp = "gproj (kernel)" if "gproj (kernel)" in pt.results else "gproj (emulated)"
        row = f"{str(causal):>6} {km:>6g} {qm:>5g} {qs:>6g} |" + "".join(
            f" {_pct(pt.results[n]['dq']):>13}" for n in names) + " |" + "".join(
            f" {_pct(pt.results[n]['dk']):>13}" for n in names) + \
            f" | {pt.results[gp]['sum_dk']:>10.1e}"
        print(row, file=out, flush=True)
    print("-" * len(hdr), file=out)
    print(verdict(points) + f"  ({time.time() - t0:.0f} s)", file=out)
    return points


def _pct(x):
    return "inf/NaN" if not math.isfinite(x) else f"{100 * x:.3g}%"


def verdict(points) -> str:
    """One line: worst FA3-arithmetic error, whether GProj meets the bars everywhere."""
    def worst(arm, key):
        vals = [p.results[arm][key] for p in points if arm in p.results]
        return max(vals) if vals else float("nan")
    gp = "gproj (kernel)" if "gproj (kernel)" in points[0].results else "gproj (emulated)"
    fa = "fa3 (kernel)" if "fa3 (kernel)" in points[0].results else "fa3 (emulated)"
    g_dq, g_dk, g_sum = worst(gp, "dq"), worst(gp, "dk"), worst(gp, "sum_dk")
    ok = g_dq <= BAR_GRAD and g_dk <= BAR_GRAD and g_sum <= BAR_SUM_DK
    base = [p.results[fa]["dq"] for p in points if p.kmean == 0 and p.qmean == 0]
    return (f"VERDICT: {'PASS' if ok else 'FAIL'} — worst median dQ error: {_pct(worst(fa, 'dq'))} "
            f"with FA3 arithmetic (vs {_pct(min(base) if base else float('nan'))} on plain inputs), "
            f"{_pct(g_dq)} with GProj (bar 0.5%); GProj worst dK {_pct(g_dk)}, "
            f"worst Σ_j dK_j residual {g_sum:.1e} (bar 1e-5)")


def to_records(points, *, dtype, head_dim, seqlen, gpu=None, commit=None):
    """Flat records in the bench/results/numerics.json schema (SPEC.md section 8)."""
    recs = []
    for p in points:
        for arm, r in p.results.items():
            impl, _, kind = arm.partition(" (")
            recs.append(dict(
                impl="gproj_cuda" if kind.startswith("kernel") else
                ("emulator" if kind.startswith("emulated") else "fp32_math"),
                numerics=impl if impl in ("fa3", "gproj") else None,
                dtype=str(dtype).replace("torch.", ""), hdim=head_dim, seqlen=seqlen,
                causal=p.causal, kmean=p.kmean, qmean=p.qmean, qscale=p.qscale,
                o_err=r["o"], dq_err=r["dq"], dk_err=r["dk"], dv_err=r["dv"],
                sum_dk_rel=r["sum_dk"], nan=r["nan"], gpu=gpu, commit=commit))
    return recs


def save_json(points, path, **kw):
    with open(path, "w") as f:
        json.dump(to_records(points, **kw), f, indent=1)
