"""Attention speed, side by side in one run: gproj_cuda (both numerics modes) and every peer that
imports on this machine (torch SDPA cuDNN / flash / memory-efficient, FlexAttention, FA3).

    python bench/speed.py                       # SPEC.md section 6 shapes (+ GQA, varlen)
    python bench/speed.py --quick               # two shapes, for a smoke test
    python bench/speed.py --out bench/results/speed.json --md bench/results/speed.md --plot bench/results/speed.png

TFLOPS = 4·B·H·N²·d / t (halved when causal); backward counts 2.5x the forward's FLOPs. Times are
medians over repeated CUDA-event timings after warm-up, with a pause between configurations;
the ratio column is to cuDNN measured in the same run (ratios travel between machines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import commit as _commit  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gproj_cuda  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402




def flops(batch, heads, seqlen_q, seqlen_k, d, causal, op):
    f = 4.0 * batch * heads * seqlen_q * seqlen_k * d
    if causal:
        f /= 2
    return {"fwd": f, "bwd": 2.5 * f, "fwd_bwd": 3.5 * f}[op]


def time_cuda(fn, *, warmup=3, min_reps=10, max_reps=100, budget_s=1.0):
    """Median milliseconds of fn() by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, budget_s / max(once, 1e-6))))
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------
# implementations: each returns a callable out = f(q, k, v) in (B, N, H, d) layout
# ---------------------------------------------------------------------------------------------

def _sdpa(backend):
    def make(causal, gqa):
        def f(q, k, v):
            with sdpa_kernel([backend]):
                o = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                    enable_gqa=gqa)
            return o.transpose(1, 2)
        return f
    return make


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)

    def make(causal, gqa):
        cache = {}

        def f(q, k, v):
            key = (q.shape[1], k.shape[1])
            if causal and key not in cache:
                cache[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None,
                                               q.shape[1], k.shape[1], device=q.device)
            o = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         block_mask=cache.get(key), enable_gqa=gqa)
            return o.transpose(1, 2)
        return f
    return make


def _fa3():
    import flash_attn_interface  # noqa: F401  (FlashAttention-3 hopper build)

    def make(causal, gqa):
        def f(q, k, v):
            o = flash_attn_interface.flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        return f
    return make


def _ours(numerics):
    def make(causal, gqa):
        def f(q, k, v):
            return gproj_cuda.attention(q, k, v, causal=causal, numerics=numerics)
        return f
    return make


def available_impls():
    impls = {"gproj_cuda/gproj": (_ours("gproj"), "gproj_cuda", "gproj"),
             "gproj_cuda/fa3": (_ours("fa3"), "gproj_cuda", "fa3"),
             "sdpa_cudnn": (_sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa_cudnn", None),
             "sdpa_flash": (_sdpa(SDPBackend.FLASH_ATTENTION), "sdpa_flash", None),
             "sdpa_efficient": (_sdpa(SDPBackend.EFFICIENT_ATTENTION), "sdpa_efficient", None)}
    try:
        impls["flex"] = (_flex(), "flex", None)
    except Exception as e:  # pragma: no cover
        print(f"(flex attention unavailable: {e})")
    try:
        impls["fa3"] = (_fa3(), "fa3", None)
    except Exception:
        pass
    return impls


def spec_shapes(quick=False, hdims=(64, 128, 256), seqlens=(1024, 2048, 4096, 8192, 16384),
                gqa=True):
    """(hdim, seqlen, causal, heads_k_divisor): B·N = 16k tokens, H·d = 2048."""
    if quick:
        return [(128, 4096, False, 1), (128, 4096, True, 1)]
    shapes = []
    for d in hdims:
        for n in seqlens:
            for causal in (False, True):
                shapes.append((d, n, causal, 1))
    if gqa and 128 in hdims:
        shapes += [(128, 4096, True, 8), (128, 16384, False, 8)]   # GQA: heads_k = heads / 8
    return shapes


def bench_one(make, d, n, causal, hk_div, ops, dtype=torch.bfloat16):
    batch = max(1, 16384 // n)
    heads = 2048 // d
    heads_k = heads // hk_div
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, n, heads, d, device="cuda", generator=g).to(dtype).requires_grad_()
    k = torch.randn(batch, n, heads_k, d, device="cuda", generator=g).to(dtype).requires_grad_()
    v = torch.randn(batch, n, heads_k, d, device="cuda", generator=g).to(dtype).requires_grad_()
    do = torch.randn(batch, n, heads, d, device="cuda", generator=g).to(dtype)
    f = make(causal, hk_div > 1)
    res = {}
    if "fwd" in ops:
        with torch.no_grad():
            res["fwd"] = time_cuda(lambda: f(q, k, v))
    if "bwd" in ops or "fwd_bwd" in ops:
        out = f(q, k, v)

        def bwd():
            q.grad = k.grad = v.grad = None
            out.backward(do, retain_graph=True)
        res["bwd"] = time_cuda(bwd)

        if "fwd_bwd" in ops:
            def fb():
                q.grad = k.grad = v.grad = None
                f(q, k, v).backward(do)
            res["fwd_bwd"] = time_cuda(fb)
    return dict(batch=batch, heads=heads, heads_k=heads_k, times=res)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--impls", default="all", help="comma list (default: all importable)")
    ap.add_argument("--ops", default="fwd,bwd")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--no-gqa", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between configurations")
    ap.add_argument("--out", help="JSON records (SPEC.md section 8 schema)")
    ap.add_argument("--md", help="Markdown table")
    ap.add_argument("--plot", help="PNG: TFLOPS ratio to cuDNN per shape")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/speed.py needs a CUDA GPU.")
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    impls = available_impls()
    if args.impls != "all":
        impls = {k: v for k, v in impls.items() if k in args.impls.split(",")}
    ops = args.ops.split(",")
    gpu, commit = torch.cuda.get_device_name(), _commit()
    records = []
    shapes = spec_shapes(args.quick, tuple(int(x) for x in args.hdims.split(",")),
                         tuple(int(x) for x in args.seqlens.split(",")), not args.no_gqa)
    print(f"{gpu}, torch {torch.__version__}, {len(shapes)} shapes x {len(impls)} impls")
    for si, (d, n, causal, hk_div) in enumerate(shapes):
        for name, (make, impl, numerics) in impls.items():
            try:
                r = bench_one(make, d, n, causal, hk_div, ops, dtype)
            except Exception as e:
                print(f"  [{si + 1}/{len(shapes)}] d={d} N={n} causal={causal} {name}: "
                      f"skipped ({type(e).__name__}: {str(e)[:80]})")
                torch.cuda.empty_cache()
                continue
            for op, ms in r["times"].items():
                fl = flops(r["batch"], r["heads"], n, n, d, causal, op)
                records.append(dict(impl=impl, numerics=numerics, op=op,
                                    dtype=args.dtype, hdim=d, seqlen=n, batch=r["batch"],
                                    heads=r["heads"], heads_k=r["heads_k"], causal=causal,
                                    ms=ms, tflops=fl / ms / 1e9, gpu=gpu,
                                    torch=torch.__version__, commit=commit))
            line = " ".join(f"{op} {r['times'][op]:.3f} ms "
                            f"({flops(r['batch'], r['heads'], n, n, d, causal, op) / r['times'][op] / 1e9:.0f} TF)"
                            for op in ops if op in r["times"])
            print(f"  [{si + 1}/{len(shapes)}] d={d} N={n} causal={causal} hk=H/{hk_div} "
                  f"{name:18s} {line}", flush=True)
            torch.cuda.empty_cache()
            time.sleep(args.pause)
    table = markdown(records)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"Measured on {gpu}, torch {torch.__version__}, commit {commit}, "
                    f"`python bench/speed.py {' '.join(argv or sys.argv[1:])}`\n\n" + table)
    if args.plot:
        plot(records, args.plot)
    return 0


def _key(r):
    return (r["hdim"], r["seqlen"], r["causal"], r["heads_k"] != r["heads"], r["op"])


def markdown(records):
    """One row per (shape, op): TFLOPS per impl and each impl's ratio to cuDNN."""
    impls = []
    for r in records:
        name = r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "")
        if name not in impls:
            impls.append(name)
    rows = {}
    for r in records:
        name = r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "")
        rows.setdefault(_key(r), {})[name] = r["tflops"]
    head = "| hdim | N | causal | GQA | op | " + " | ".join(impls) + " |"
    lines = [head, "|" + "---|" * (5 + len(impls))]
    for key in sorted(rows):
        vals = rows[key]
        ref = vals.get("sdpa_cudnn")
        cells = []
        for i in impls:
            if i not in vals:
                cells.append("-")
            elif ref and i != "sdpa_cudnn":
                cells.append(f"{vals[i]:.0f} ({vals[i] / ref:.2f}x)")
            else:
                cells.append(f"{vals[i]:.0f}")
        d, n, causal, gqa, op = key
        lines.append(f"| {d} | {n} | {causal} | {gqa} | {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nTFLOPS (ratio to cuDNN in the same run).\n"


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, op in zip(axes, ("fwd", "bwd")):
        rs = [r for r in records if r["op"] == op]
        cudnn = {_key(r): r["tflops"] for r in rs if r["impl"] == "sdpa_cudnn"}
        keys = sorted(cudnn)
        names = sorted({r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "") for r in rs})
        for name in names:
            ys = []
            for key in keys:
                m = [r["tflops"] for r in rs if _key(r) == key and
                     r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "") == name]
                ys.append(m[0] / cudnn[key] if m else math.nan)
            ax.plot(range(len(keys)), ys, marker="o", label=name)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"d{k[0]} N{k[1] // 1024}k{' c' if k[2] else ''}{' gqa' if k[3] else ''}"
                            for k in keys], rotation=70, fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_title(f"{op}: TFLOPS / cuDNN (same run)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
