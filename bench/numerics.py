"""Gradient accuracy on the SPEC.md section 5 stress grid, every backend side by side.

    python bench/numerics.py --smoke                  # CPU, seconds: emulator arms, small N
    python bench/numerics.py --out bench/results/numerics.json --md bench/results/numerics.md \\
        --plot bench/results/numerics.png              # H200: the whole grid, 576 points
    python bench/numerics.py --core ...                # N=4096 only for d=128 (384 points)

Backends: gproj_cuda kernels in both numerics modes ("gproj", "fa3"), torch SDPA with the cuDNN
and the flash (FA2) backends, and FP32 math attention (the float64 reference's code run in fp32).
Without a GPU (``--smoke``, ``--device cpu``) the gproj_cuda arms run the CPU emulation of the
kernels' arithmetic (``gproj_cuda.reference.emulate``, the same code the op runs on CPU tensors)
and the SDPA arms are skipped.

Grid: q = qscale·N(0,1) + qmean·u, k = N(0,1) + kmean·w (u, w fixed random ±1 vectors per head),
v, dO ~ N(0,1); B=1, H=2; kmean x qmean x qscale x causal x (hdim, N) x dtype. Each point's
inputs depend only on the point (seed from its parameters), so subsets reproduce the full grid.
The core shapes (N=1024 for every head dim, N=4096 for d=128) run first; on CUDA a time budget
(--budget-s, default 480 s) stops starting new points so one run always ends well inside 10
minutes with everything that ran written out.

Per point and backend: o_err, dq_err, dk_err, dv_err = median over query (key) rows of
||g_i - ref_i|| / ||ref_i|| against float64 attention on the same rounded inputs
(``metrics.row_rel_err``; NaN/inf gives inf); sum_dk_rel = |Σ_j dK_j| / Σ_j ||dK_j|| (worst
head), for gproj_cuda on dK before its final rounding (``dk_accum``), for the others on the dK
they return; nan = any NaN in O, dQ, dK or dV. dk_err is of the stored (rounded) dK for every
backend; gproj_cuda records also carry dk32_err, the error before the final rounding, which is
what the SPEC bar and tests/test_gpu.py judge.

The FMA edge case (q = k = v = 133120, BF16, d=64, N=1024) is added as records with
kmean=133120, qmean=0, qscale=0, case="fma_edge" (nan = NaN in the output; grad_nan separately).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import commit as _commit  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gproj_cuda  # noqa: E402
from gproj_cuda import reference  # noqa: E402
from gproj_cuda.metrics import row_rel_err, stress_inputs, sum_dk_rel  # noqa: E402

BAR_GRAD = 0.005       # gproj: median dQ / dK error
BAR_SUM_DK = 1e-5      # gproj: Σ_j dK_j residual floor (or 10x float64's own, tests/test_emulator.py)
O_SLACK = 1e-4         # gproj: O error <= 2x FP32-rounded + this (as tests/test_gpu.py)
FMA_EDGE_VALUE = 133120

# display name -> (record impl, record numerics); order = table column order
BACKENDS = ["gproj", "fa3-mode", "cuDNN", "FA2", "FP32", "fa3-emu"]




def _dtype_name(dt):
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dt]


# ---------------------------------------------------------------------------------------------
# backends: run(q, k, v, do, causal) -> dict(o, dq, dk, dv, dk32 or None); layout (B, N, H, d)
# ---------------------------------------------------------------------------------------------

def _kernel_arm(mode):
    from gproj_cuda.ops import backward_cuda, forward_cuda

    def run(q, k, v, do, causal):
        scale = 1.0 / math.sqrt(q.shape[-1])
        wl, wr = -1, (0 if causal else -1)
        out, _, stats = forward_cuda(q, k, v, None, None, q.shape[1], k.shape[1], scale, wl, wr,
                                     mode)
        dk32 = torch.full(k.shape, float("nan"), dtype=torch.float32, device=k.device)
        dq, dk, dv = backward_cuda(do, q, k, v, out, stats, None, None, q.shape[1], k.shape[1],
                                   scale, wl, wr, mode, dk_accum=dk32)
        return dict(o=out, dq=dq, dk=dk, dv=dv, dk32=dk32)
    return run


def _emulator_arm(mode):
    # The arithmetic torch.ops.gproj.attention runs on CPU tensors; fp32_grads gives dK before
    # its final rounding, and .to(dtype) the stored values (bitwise what the op returns).
    def run(q, k, v, do, causal):
        o, _, dq, dk, dv = reference.emulate(q, k, v, do, numerics=mode, causal=causal,
                                             fp32_grads=True)
        dt = q.dtype
        return dict(o=o, dq=dq.to(dt), dk=dk.to(dt), dv=dv.to(dt), dk32=dk)
    return run


def _sdpa_arm(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, do, causal):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        with sdpa_kernel([backend]):
            o = torch.nn.functional.scaled_dot_product_attention(
                qq.transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
                is_causal=causal).transpose(1, 2)
            o.backward(do)
        return dict(o=o.detach(), dq=qq.grad, dk=kk.grad, dv=vv.grad, dk32=None)
    return run


def _fp32_arm(q, k, v, do, causal):
    o, _, dq, dk, dv = reference.attention_grads(q, k, v, do, causal=causal,
                                                 compute_dtype=torch.float32)
    return dict(o=o, dq=dq, dk=dk, dv=dv, dk32=None)


def make_backends(device, wanted, emulator_on_gpu=False):
    """name -> (impl, numerics, run). Prints why a wanted backend is left out."""
    arms = {}
    on_gpu = device == "cuda"
    use_kernels = on_gpu and not emulator_on_gpu
    if use_kernels and not gproj_cuda.is_available():
        print(f"note: gproj_cuda kernels unavailable ({gproj_cuda.unavailable_reason()}); "
              "gproj / fa3-mode arms run the emulator instead")
        use_kernels = False
    for name, mode in (("gproj", "gproj"), ("fa3-mode", "fa3")):
        if name in wanted:
            arms[name] = (("gproj_cuda", mode, _kernel_arm(mode)) if use_kernels
                          else ("emulator", mode, _emulator_arm(mode)))
    if on_gpu:
        from torch.nn.attention import SDPBackend
        if "cuDNN" in wanted:
            arms["cuDNN"] = ("sdpa_cudnn", None, _sdpa_arm(SDPBackend.CUDNN_ATTENTION))
        if "FA2" in wanted:
            arms["FA2"] = ("sdpa_flash", None, _sdpa_arm(SDPBackend.FLASH_ATTENTION))
    else:
        skipped = [n for n in ("cuDNN", "FA2") if n in wanted]
        if skipped:
            print(f"note: {' and '.join(skipped)} (torch SDPA cuDNN / flash backends) need CUDA; "
                  "skipped on CPU")
    if "FP32" in wanted:
        arms["FP32"] = ("fp32_math", None, _fp32_arm)
    if use_kernels and "fa3-emu" in wanted:
        # FA3's arithmetic emulated (on the GPU tensors): the yardstick of the fa3 mode (SPEC:
        # the kernel's fa3 mode within 2x of a faithful emulation of FA3 arithmetic).
        arms["fa3-emu"] = ("emulator", "fa3", _emulator_arm("fa3"))
    return arms


# ---------------------------------------------------------------------------------------------
# the grid
# ---------------------------------------------------------------------------------------------

def point_seed(base, dtype, d, n, causal, km, qm, qs):
    key = f"{dtype}|{d}|{n}|{int(causal)}|{km:g}|{qm:g}|{qs:g}"
    return (base * 1000003 + zlib.crc32(key.encode())) % (2 ** 31)


def build_grid(args):
    """Core shapes first (N <= 1024, and every N for --long-hdims), then the rest unless --core:
    if the time budget cuts the run short, what is lost is the least important part."""
    core, rest = [], []
    for d in args.hdims:
        for n in args.seqlens:
            (core if n <= 1024 or d in args.long_hdims else rest).append((d, n))
    grid = []
    for shapes in ((core,) if args.core else (core, rest)):
        for dt in args.dtypes:
            for d, n in shapes:
                for causal, km, qm, qs in itertools.product(args.causal, args.kmeans, args.qmeans,
                                                            args.qscales):
                    grid.append((dt, d, n, causal, km, qm, qs))
    return grid


def _nan_any(res):
    return any(bool(torch.isnan(res[key].float()).any()) for key in ("o", "dq", "dk", "dv")
               if res.get(key) is not None)


def run_point(arms, pt, *, heads, device, seed, meta):
    dt_name, d, n, causal, km, qm, qs = pt
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt_name]
    q, k, v, do = stress_inputs(1, n, heads, d, kmean=km, qmean=qm, qscale=qs, dtype=dtype,
                                device=device, seed=point_seed(seed, dt_name, d, n, causal, km,
                                                               qm, qs))
    ref_o, _, ref_dq, ref_dk, ref_dv = reference.attention_grads(q, k, v, do, causal=causal)
    ref_sum = sum_dk_rel(ref_dk)
    # the O bar's yardstick: FP32 attention rounded to the input dtype
    o32 = reference.attention_grads(q, k, v, None, causal=causal, compute_dtype=torch.float32)[0]
    o_fp32_rounded = row_rel_err(o32.to(dtype), ref_o)
    del o32
    recs, skipped = [], []
    for name, (impl, numerics, run) in arms.items():
        try:
            res = run(q, k, v, do, causal)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # unsupported shape/dtype for this backend
            skipped.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
            if device == "cuda":
                torch.cuda.empty_cache()
            continue
        dk_for_sum = res["dk32"] if res["dk32"] is not None else res["dk"]
        rec = dict(impl=impl, numerics=numerics, dtype=dt_name, hdim=d, seqlen=n, causal=causal,
                   kmean=km, qmean=qm, qscale=qs,
                   o_err=row_rel_err(res["o"], ref_o), dq_err=row_rel_err(res["dq"], ref_dq),
                   dk_err=row_rel_err(res["dk"], ref_dk), dv_err=row_rel_err(res["dv"], ref_dv),
                   sum_dk_rel=sum_dk_rel(dk_for_sum), nan=_nan_any(res),
                   **meta, case="grid", backend=name, batch=1, heads=heads,
                   ref_sum_dk_rel=ref_sum, o_err_fp32_rounded=o_fp32_rounded)
        if res["dk32"] is not None:
            rec["dk32_err"] = row_rel_err(res["dk32"], ref_dk)
        recs.append(rec)
        del res
    return recs, skipped


def run_fma_edge(arms, *, device, meta, n=1024, d=64, heads=2):
    """q = k = v = 133120 (BF16): FA3's fused exp2 gives the maximal element exp2(residual)."""
    x = torch.full((1, n, heads, d), FMA_EDGE_VALUE, dtype=torch.float32).bfloat16().to(device)
    do = torch.randn(1, n, heads, d, generator=torch.Generator().manual_seed(7)).bfloat16().to(device)
    ref_o = reference.attention_grads(x, x, x, None)[0]
    recs = []
    for name, (impl, numerics, run) in arms.items():
        try:
            res = run(x, x, x, do, False)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            print(f"  fma edge: {name} skipped ({type(e).__name__}: {str(e)[:80]})")
            continue
        o_nan = bool(torch.isnan(res["o"].float()).any())
        g_nan = any(bool(torch.isnan(res[key].float()).any()) for key in ("dq", "dk", "dv"))
        recs.append(dict(impl=impl, numerics=numerics, dtype="bf16", hdim=d, seqlen=n,
                         causal=False, kmean=FMA_EDGE_VALUE, qmean=0, qscale=0,
                         o_err=row_rel_err(res["o"], ref_o), dq_err=None, dk_err=None,
                         dv_err=None, sum_dk_rel=None, nan=o_nan, **meta, case="fma_edge",
                         backend=name, batch=1, heads=heads, grad_nan=g_nan))
    return recs


# ---------------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------------

def _pct(x):
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf/NaN"
    return f"{100 * x:.3g}%"


def _median(xs):
    return statistics.median(xs) if xs else None


def _by_point(records):
    pts = {}
    for r in records:
        if r.get("case", "grid") != "grid":
            continue
        key = (r["dtype"], r["hdim"], r["seqlen"], r["causal"], r["kmean"], r["qmean"], r["qscale"])
        pts.setdefault(key, {})[r["backend"]] = r
    return pts


def gproj_bars(records, backend="gproj"):
    """Checks of SPEC.md section 5 for the gproj arm: list of (bar, worst, violations, n)."""
    rs = [r for r in records if r.get("case", "grid") == "grid" and r["backend"] == backend]
    if not rs:
        return []
    n = len(rs)

    def dk_of(r):
        return r.get("dk32_err", r["dk_err"])
    out = []
    out.append(("dQ median error ≤ 0.5%", _pct(max(r["dq_err"] for r in rs)),
                sum(not (r["dq_err"] <= BAR_GRAD) for r in rs), n))
    out.append(("dK median error ≤ 0.5% (fp32 dK before the store)", _pct(max(dk_of(r) for r in rs)),
                sum(not (dk_of(r) <= BAR_GRAD) for r in rs), n))
    out.append(("dK median error ≤ 0.5% (stored dK, informative)",
                _pct(max(r["dk_err"] for r in rs)), sum(not (r["dk_err"] <= BAR_GRAD) for r in rs), n))
    sums = [(r["sum_dk_rel"], max(BAR_SUM_DK, 10 * r["ref_sum_dk_rel"])) for r in rs]
    out.append(("Σ_j dK_j residual ≤ max(1e-5, 10x float64's own)",
                f"{max(s for s, _ in sums):.2e} (worst ratio to bar "
                f"{max(s / b for s, b in sums):.2g})", sum(not (s <= b) for s, b in sums), n))
    out.append(("O error ≤ 2x FP32-attention-rounded (+1e-4)",
                f"{_pct(max(r['o_err'] for r in rs))} (worst ratio "
                f"{max(r['o_err'] / max(r['o_err_fp32_rounded'], 1e-12) for r in rs):.2g}x)",
                sum(not (r["o_err"] <= 2 * r["o_err_fp32_rounded"] + O_SLACK) for r in rs), n))
    out.append(("no NaN", "-", sum(bool(r["nan"]) for r in rs), n))
    return out


def headline(records):
    """'median dQ error: X% (cuDNN) → Y% (gproj)' over the grid points both ran."""
    pts = _by_point(records)
    common = [p for p in pts.values() if "cuDNN" in p and "gproj" in p]
    if common:
        x = _median([p["cuDNN"]["dq_err"] for p in common])
        y = _median([p["gproj"]["dq_err"] for p in common])
        return f"median dQ error: {_pct(x)} (cuDNN) → {_pct(y)} (gproj)"
    y = _median([p["gproj"]["dq_err"] for p in pts.values() if "gproj" in p])
    return f"median dQ error: n/a (cuDNN) → {_pct(y)} (gproj)"


def worst_lines(records):
    lines = []
    rs = [r for r in records if r.get("case", "grid") == "grid"]
    pts = _by_point(records)
    common = [p for p in pts.values() if "cuDNN" in p and "gproj" in p]
    if common:
        lines.append(f"worst dQ error: {_pct(max(p['cuDNN']['dq_err'] for p in common))} (cuDNN) → "
                     f"{_pct(max(p['gproj']['dq_err'] for p in common))} (gproj)")
    for b in BACKENDS:
        sub = [r for r in rs if r["backend"] == b]
        if not sub:
            continue
        w = max(sub, key=lambda r: r["dq_err"])
        lines.append(f"worst dQ error {b:9s}: {_pct(w['dq_err']):>9s} at {w['dtype']} d={w['hdim']} "
                     f"N={w['seqlen']} causal={w['causal']} kmean={w['kmean']:g} "
                     f"qmean={w['qmean']:g} qscale={w['qscale']:g}; median "
                     f"{_pct(_median([r['dq_err'] for r in sub]))} over {len(sub)} points")
    return lines


def markdown(records, header=""):
    pts = _by_point(records)
    present = [b for b in BACKENDS if any(b in p for p in pts.values())]
    lines = [header] if header else []
    lines.append("## Summary: " + headline(records) + "\n")
    lines.append("| backend | impl | points | median dQ | worst dQ | worst dK (stored) | worst O | "
                 "worst Σ dK residual | NaN points |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    rs = [r for r in records if r.get("case", "grid") == "grid"]
    for b in present:
        sub = [r for r in rs if r["backend"] == b]
        impl = sub[0]["impl"] + (f"/{sub[0]['numerics']}" if sub[0]["numerics"] else "")
        lines.append(f"| {b} | {impl} | {len(sub)} | {_pct(_median([r['dq_err'] for r in sub]))} | "
                     f"{_pct(max(r['dq_err'] for r in sub))} | {_pct(max(r['dk_err'] for r in sub))} | "
                     f"{_pct(max(r['o_err'] for r in sub))} | "
                     f"{max(r['sum_dk_rel'] for r in sub):.2e} | {sum(bool(r['nan']) for r in sub)} |")
    bars = gproj_bars(records)
    if bars:
        impl = next(r["impl"] for r in rs if r["backend"] == "gproj")
        lines.append(f"\n### SPEC.md section 5 bars for gproj ({impl})\n")
        lines.append("| bar | worst | violations | verdict |")
        lines.append("|---|---|---|---|")
        for name, worst, bad, n in bars:
            verdict = "info" if "informative" in name else ("PASS" if bad == 0 else "FAIL")
            lines.append(f"| {name} | {worst} | {bad} / {n} | {verdict} |")
    edge = [r for r in records if r.get("case") == "fma_edge"]
    if edge:
        lines.append(f"\n### FMA edge case: q = k = v = {FMA_EDGE_VALUE:g} (bf16, d={edge[0]['hdim']}, "
                     f"N={edge[0]['seqlen']})\n")
        lines.append("| backend | impl | output NaN | gradient NaN | O error |")
        lines.append("|---|---|---|---|---|")
        for r in edge:
            impl = r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "")
            lines.append(f"| {r['backend']} | {impl} | {'**yes**' if r['nan'] else 'no'} | "
                         f"{'yes' if r['grad_nan'] else 'no'} | {_pct(r['o_err'])} |")
    lines.append("\n## Per grid point: median per-row relative dQ error vs float64\n")
    lines.append("| dtype | d | N | causal | kmean | qmean | qscale | " +
                 " | ".join(f"{b} dQ" for b in present) +
                 " | gproj dK (fp32) | gproj Σ dK | gproj bars |")
    lines.append("|" + "---|" * (7 + len(present) + 3))
    for key in sorted(pts, key=lambda t: (t[0], t[1], t[2], t[3], t[4], t[5], t[6])):
        p = pts[key]
        dt, d, n, causal, km, qm, qs = key
        cells = [_pct(p[b]["dq_err"]) if b in p else "-" for b in present]
        g = p.get("gproj")
        if g:
            dk = g.get("dk32_err", g["dk_err"])
            ok = (g["dq_err"] <= BAR_GRAD and dk <= BAR_GRAD
                  and g["sum_dk_rel"] <= max(BAR_SUM_DK, 10 * g["ref_sum_dk_rel"])
                  and g["o_err"] <= 2 * g["o_err_fp32_rounded"] + O_SLACK and not g["nan"])
            tail = [_pct(dk), f"{g['sum_dk_rel']:.1e}", "ok" if ok else "**FAIL**"]
        else:
            tail = ["-", "-", "-"]
        lines.append(f"| {dt} | {d} | {n} | {causal} | {km:g} | {qm:g} | {qs:g} | " +
                     " | ".join(cells + tail) + " |")
    lines.append("\nErrors: median over rows of ||g_i − ref_i|| / ||ref_i|| against float64 attention on "
                 "the same rounded inputs (SPEC.md section 5); inf/NaN = non-finite values.\n")
    return "\n".join(lines) + "\n"


def plot(records, path, agg="median"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm
    import numpy as np

    rs = [r for r in records if r.get("case", "grid") == "grid"]
    backends = [b for b in BACKENDS if any(r["backend"] == b for r in rs)]
    kmeans = sorted({r["kmean"] for r in rs})
    qscales = sorted({r["qscale"] for r in rs})
    qmeans = sorted({r["qmean"] for r in rs})
    if not backends:
        return
    f = statistics.median if agg == "median" else max
    sentinel = 1e12                               # inf/NaN cells: labelled "inf", top colour
    mats = {}
    for b in backends:
        for qm in qmeans:
            m = np.full((len(kmeans), len(qscales)), np.nan)
            for i, km in enumerate(kmeans):
                for j, qs in enumerate(qscales):
                    vals = [r["dq_err"] if math.isfinite(r["dq_err"]) else sentinel
                            for r in rs if r["backend"] == b and
                            r["kmean"] == km and r["qscale"] == qs and r["qmean"] == qm]
                    if vals:
                        m[i, j] = f(vals)
            mats[b, qm] = m
    allv = np.concatenate([m[np.isfinite(m) & (m < sentinel)].ravel() for m in mats.values()])
    pos = allv[allv > 0]
    vmin = max(float(pos.min()) if pos.size else 1e-5, 1e-6)
    vmax = max(float(allv.max()) if allv.size else 1.0, vmin * 10)
    norm = LogNorm(vmin=vmin, vmax=vmax)
    fig, axes = plt.subplots(len(backends), len(qmeans),
                             figsize=(3.2 * len(qmeans) + 1.5, 2.4 * len(backends) + 0.8),
                             squeeze=False)
    im = None
    for bi, b in enumerate(backends):
        for qi, qm in enumerate(qmeans):
            ax = axes[bi][qi]
            m = mats[b, qm]
            im = ax.imshow(np.clip(m, vmin, vmax), norm=norm, cmap="viridis", aspect="auto",
                           origin="lower")
            for i in range(len(kmeans)):
                for j in range(len(qscales)):
                    if np.isfinite(m[i, j]):
                        txt = "inf" if m[i, j] >= sentinel else _pct(m[i, j])
                        ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                                color="white" if norm(min(max(m[i, j], vmin), vmax)) < 0.6
                                else "black")
            ax.set_xticks(range(len(qscales)))
            ax.set_xticklabels([f"{x:g}" for x in qscales])
            ax.set_yticks(range(len(kmeans)))
            ax.set_yticklabels([f"{x:g}" for x in kmeans])
            ax.set_title(f"{b}, qmean {qm:g}", fontsize=9)
            if qi == 0:
                ax.set_ylabel("kmean")
            if bi == len(backends) - 1:
                ax.set_xlabel("qscale")
    fig.suptitle(f"dQ median per-row relative error vs float64 ({agg} over causal, N, d, dtype)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.96))
    cax = fig.add_axes((0.92, 0.1, 0.02, 0.8))
    fig.colorbar(im, cax=cax, label="relative error (1 = 100%)")
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------

def _floats(s):
    vals = (float(x) for x in s.split(","))
    return tuple(int(v) if v.is_integer() else v for v in vals)


def _ints(s):
    return tuple(int(x) for x in s.split(","))


def _bools(s):
    m = {"f": False, "false": False, "0": False, "n": False, "t": True, "true": True, "1": True,
         "y": True}
    return tuple(m[x.strip().lower()] for x in s.split(","))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check in seconds: emulator arms, N=128, d=64 (+ the FMA edge)")
    ap.add_argument("--core", action="store_true",
                    help="reduced grid: N > 1024 only for --long-hdims (384 instead of 576 points)")
    ap.add_argument("--full", action="store_true",
                    help="the whole grid, every N for every head dim (the default; kept for clarity)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--backends", default=",".join(BACKENDS),
                    help=f"comma list of {','.join(BACKENDS)}")
    ap.add_argument("--kmeans", type=_floats, default=(0, 32, 256, 1024))
    ap.add_argument("--qmeans", type=_floats, default=(0, 16))
    ap.add_argument("--qscales", type=_floats, default=(1, 16, 32))
    ap.add_argument("--causal", type=_bools, default=(False, True), help="e.g. F,T or T")
    ap.add_argument("--seqlens", type=_ints, default=(1024, 4096))
    ap.add_argument("--hdims", type=_ints, default=(64, 128, 256))
    ap.add_argument("--long-hdims", type=_ints, default=(128,),
                    help="head dims that run N > 1024 first, and alone with --core (default 128)")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-edge", action="store_true", help="skip the FMA edge case")
    ap.add_argument("--emulator-on-gpu", action="store_true",
                    help="on CUDA, run the gproj/fa3-mode arms through the emulator, not the kernels")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting grid points after this many seconds (default: 480 on "
                         "CUDA, none on CPU); what ran is still written")
    ap.add_argument("--out", help="JSON records (SPEC.md section 8 schema + extra fields)")
    ap.add_argument("--md", help="Markdown tables")
    ap.add_argument("--plot", help="PNG heatmaps of dQ error over (kmean, qscale)")
    ap.add_argument("--plot-agg", choices=("median", "max"), default="median",
                    help="how a heatmap cell combines causal/N/d/dtype (default median)")
    args = ap.parse_args(argv)
    args.dtypes = tuple(x.strip() for x in args.dtypes.split(","))
    if args.smoke:
        args.device = "cpu"
        if "--seqlens" not in (argv or sys.argv[1:]):
            args.seqlens = (128,)
        if "--hdims" not in (argv or sys.argv[1:]):
            args.hdims = (64,)
    return args


def main(argv=None):
    args = parse(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke and max(args.seqlens) > 1024:
        print("note: no GPU; running the CPU emulator at N > 1024 is slow (use --smoke for a check)")
    if device == "cuda":
        # FP32 attention means fp32, not TF32 ("highest" is torch's default; made explicit)
        torch.set_float32_matmul_precision("highest")
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    budget = args.budget_s if args.budget_s is not None else (480.0 if device == "cuda" else None)
    torch.set_grad_enabled(True)
    wanted = [b.strip() for b in args.backends.split(",")]
    bad = [b for b in wanted if b not in BACKENDS]
    if bad:
        print(f"unknown backends {bad}; choose from {BACKENDS}")
        return 2
    arms = make_backends(device, wanted, args.emulator_on_gpu)
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    meta = dict(gpu=gpu, commit=_commit(), torch=torch.__version__)
    grid = build_grid(args)
    cmd = "python bench/numerics.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"{gpu or 'CPU'}, torch {torch.__version__}, commit {meta['commit']}: {len(grid)} grid "
          f"points x {len(arms)} backends ({', '.join(f'{n}={a[0]}' for n, a in arms.items())}), "
          f"B=1 H={args.heads}" + (f", budget {budget:.0f} s" if budget else ""), flush=True)
    records = []
    t0 = time.time()

    def save():
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(records, f, indent=1)

    if not args.no_edge:
        edge = run_fma_edge(arms, device=device, meta=meta)
        records += edge
        print("FMA edge q=k=v=133120 (bf16 d=64 N=1024): output NaN: " +
              ", ".join(f"{r['backend']} {'YES' if r['nan'] else 'no'}" for r in edge) +
              f"  ({time.time() - t0:.1f} s)", flush=True)

    seen_skips = set()
    stopped = None
    for i, pt in enumerate(grid):
        if budget is not None and time.time() - t0 > budget:
            stopped = i
            print(f"budget of {budget:.0f} s reached: stopping after {i} of {len(grid)} points "
                  "(raise --budget-s or run a subset)", flush=True)
            break
        t1 = time.time()
        recs, skipped = run_point(arms, pt, heads=args.heads, device=device, seed=args.seed,
                                  meta=meta)
        records += recs
        for s in skipped:
            key = (pt[0], pt[1], pt[2], s.split(":")[0])
            if key not in seen_skips:
                seen_skips.add(key)
                print(f"  skipped {s} (dtype {pt[0]} d={pt[1]} N={pt[2]}; not repeated)")
        by = {r["backend"]: r for r in recs}
        dt, d, n, causal, km, qm, qs = pt
        cells = " ".join(f"{b} {_pct(by[b]['dq_err'])}" for b in BACKENDS if b in by)
        g = by.get("gproj")
        gtail = (f" | gproj dK {_pct(g.get('dk32_err', g['dk_err']))} Σdk {g['sum_dk_rel']:.1e}"
                 if g else "")
        nan = [b for b, r in by.items() if r["nan"]]
        print(f"[{i + 1}/{len(grid)}] {dt} d={d} N={n} causal={'T' if causal else 'F'} "
              f"km={km:g} qm={qm:g} qs={qs:g} | dQ: {cells}{gtail}"
              f"{' | NaN: ' + ','.join(nan) if nan else ''} | {time.time() - t1:.2f} s "
              f"(elapsed {time.time() - t0:.0f} s)", flush=True)
        if (i + 1) % 25 == 0:
            save()
    save()
    print()
    print(headline(records))
    for line in worst_lines(records):
        print(line)
    for name, worst, badn, n in gproj_bars(records):
        tag = "info" if "informative" in name else ("PASS" if badn == 0 else "FAIL")
        print(f"gproj bar [{tag}] {name}: worst {worst}, {badn}/{n} points violate")
    if stopped is not None:
        print(f"(incomplete: {stopped}/{len(grid)} grid points ran)")
    header = (f"Measured on {gpu or 'CPU (emulator arms)'}, torch {torch.__version__}, commit "
              f"{meta['commit']}, `{cmd}`; B=1, H={args.heads}; "
              f"{len(_by_point(records))} grid points"
              + (f" (stopped by the time budget after {stopped} of {len(grid)})" if stopped is not None
                 else "") + f", {time.time() - t0:.0f} s.\n")
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(records, header))
    if args.plot:
        try:
            plot(records, args.plot, args.plot_agg)
        except Exception as e:  # matplotlib missing: the JSON / Markdown still stand
            print(f"plot skipped ({type(e).__name__}: {e})")
    if args.out or args.md or args.plot:
        print("wrote " + ", ".join(p for p in (args.out, args.md, args.plot) if p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
