"""Attention speed, side by side in one run: gproj_cuda (both numerics modes) and every peer that
imports on this machine (torch SDPA cuDNN / flash / memory-efficient, FlexAttention, FA3).

    python bench/speed.py                       # SPEC.md section 6 shapes (+ GQA, varlen)
    python bench/speed.py --quick               # two shapes, for a smoke test
    python bench/speed.py --impls flex --warm-only   # compile FlexAttention's kernels for every
                                                # shape (fills the inductor/Triton disk caches
                                                # so a timing run later compiles in seconds)
    python bench/speed.py --out bench/results/speed.json --md bench/results/speed.md --plot bench/results/speed.png

TFLOPS = 4·B·H·N²·d / t (halved when causal); backward counts 2.5x the forward's FLOPs. Times are
medians over repeated CUDA-event timings after warm-up, with a pause between configurations;
the ratio column is to cuDNN measured in the same run (ratios travel between machines). Each
timed op first runs back to back for --warm-s seconds (0.3): under a sustained load the H200
sits at its 700 W power cap with its clock 15-25% below the boost clock, which is what a
training loop sees, and timing from an idle GPU mixed the two regimes (up to 14% between rounds
of one implementation; bench/NOTES.md session 34). --warm-s 0 times as before session 34.

Shapes: B*N = --tokens (16k), H*d = --width (2048); "dense" (heads_k = heads), "gqa" (heads_k =
heads / 8) and "varlen" (--tokens packed into sequences of random lengths with the given mean,
seqlen = the longest; gproj_cuda.attention_varlen, SDPA through nested jagged tensors, flex with a
document mask). Records go to --out after every shape (a run stopped by a timeout keeps what it
measured). --device cpu with tiny --tokens/--width checks the code paths without a GPU.
Inputs are N(0,1); --kmean X adds X w to the keys (w a fixed random +-1 per head and coordinate,
the SPEC grid's key offset): the keys then carry the common offset that gproj's exact centering
removes, which random keys skip (its range pass stops early and no K' is written).
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


BUDGET_S = 1.0      # per timed op (--budget-s)
WARM_S = 0.0        # back-to-back calls before each timed op (--warm-s)
DEVICE = "cuda"     # --device cpu: code-path check only (perf_counter timings)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_cuda(fn, *, warmup=3, min_reps=10, max_reps=100, budget_s=None, warm_s=None):
    """Median milliseconds of fn() by CUDA events (perf_counter on --device cpu).

    The calls are queued back to back and synchronized once, as in a training loop, where the
    CPU runs ahead of the GPU: each call's events then bracket its GPU work. (Until 2026-11-29
    every call was synchronized, so each one started on an idle GPU and its time included the
    host's dispatch up to its first kernel; that inflated short calls, ours the most: several
    launches per call. bench/NOTES.md, session 5.) A call whose host overhead exceeds its GPU
    time still shows it: the GPU then waits on the host.

    warm_s: seconds of back-to-back calls before the timed ones. Under a sustained load the H200
    reaches its 700 W cap within ~0.1-0.3 s and its SM clock drops from 1.98 GHz to 1.5-1.8 GHz,
    by how much depending on the kernel's energy per cycle (bench/NOTES.md session 34); timed
    from an idle GPU, the first part of a 0.2 s window runs at the boost clock and the median
    lands between the two regimes, differently for each implementation and round. Warmed, every
    implementation is timed in the sustained regime a training loop runs in."""
    budget_s = BUDGET_S if budget_s is None else budget_s
    warm_s = WARM_S if warm_s is None else warm_s
    for _ in range(warmup):
        fn()
    _sync()
    if warm_s > 0 and DEVICE == "cuda":
        t_warm = time.perf_counter()
        while time.perf_counter() - t_warm < warm_s:
            for _ in range(8):
                fn()
            _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    once = time.perf_counter() - t0
    reps = int(min(max_reps, max(min_reps, budget_s / max(once, 1e-6))))
    times, events = [], []
    for _ in range(reps):
        if DEVICE != "cuda":
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        events.append((a, b))
    _sync()
    times += [a.elapsed_time(b) for a, b in events]
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------
# implementations: make(causal, gqa, varlen) returns out = f(q, k, v); dense tensors are
# (B, N, H, d), varlen ones (total, H, d) with varlen = dict(cu=int32 prefix sums, max=longest,
# offsets=int64 prefix sums, lens=[...], doc=document id per token)
# ---------------------------------------------------------------------------------------------

def _sdpa(backend):
    def make(causal, gqa, varlen=None):
        kw = {"enable_gqa": True} if gqa else {}

        def f(q, k, v):
            if varlen is not None:      # nested jagged tensors: one ragged dim shared by q, k, v
                nj = lambda x: torch.nested.nested_tensor_from_jagged(   # noqa: E731
                    x, varlen["offsets"], min_seqlen=min(varlen["lens"]), max_seqlen=varlen["max"])
                q, k, v = nj(q), nj(k), nj(v)
            with sdpa_kernel([backend]):
                o = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, **kw)
            o = o.transpose(1, 2)
            return o.values() if varlen is not None else o
        return f
    return make


def _flex():
    import torch._dynamo.config as dcfg
    import torch._functorch.config as fcfg
    # the backward is timed by repeated out.backward(retain_graph=True) on one forward; with
    # donated buffers (the default) a compiled backward refuses that ("compiled with non-empty
    # donated buffers which requires ... retain_graph=False": the H200 run of 37c6b83 lost flex)
    fcfg.donated_buffer = False
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    for name, val in (("recompile_limit", 1024), ("cache_size_limit", 1024),
                      ("accumulated_recompile_limit", 4096), ("accumulated_cache_size_limit", 4096)):
        try:            # one graph per shape: the default limit (8) would fall back to eager
            setattr(dcfg, name, val)
        except Exception:
            pass
    compiled = torch.compile(flex_attention, dynamic=False)

    def make(causal, gqa, varlen=None):
        cache = {}

        def f(q, k, v):
            if varlen is not None:
                q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
            key = (q.shape[1], k.shape[1])
            if varlen is not None and key not in cache:
                doc = varlen["doc"]
                if causal:
                    def mm(b, h, qi, ki):
                        return (doc[qi] == doc[ki]) & (qi >= ki)
                else:
                    def mm(b, h, qi, ki):
                        return doc[qi] == doc[ki]
                cache[key] = create_block_mask(mm, None, None, key[0], key[1], device=q.device)
            elif causal and key not in cache:
                cache[key] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None,
                                               key[0], key[1], device=q.device)
            o = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                         block_mask=cache.get(key), enable_gqa=gqa).transpose(1, 2)
            return o[0] if varlen is not None else o
        return f
    return make


def _fa3_backward():
    """FlashAttention-3's own backward where a standalone build of it is at hand (the forward
    wheel has none): FA3_BWD_DIR names the folder with its ctypes wrapper fa3bwd.py and
    libfa3bwd.so (bench/fa3_bwd/README.md), else None and the fa3 rows have no backward."""
    path = os.environ.get("FA3_BWD_DIR")
    if not path:
        return None
    import importlib.util
    spec = importlib.util.spec_from_file_location("fa3bwd", os.path.join(path, "fa3bwd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fa3():
    import flash_attn_interface  # noqa: F401  (FlashAttention-3 hopper build)
    bwd = _fa3_backward()

    def make(causal, gqa, varlen=None):
        if bwd is not None and varlen is None:
            # dense: FlashAttention-3's forward (out, LSE) and its standalone backward
            class FA3(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v):
                    scale = q.shape[-1] ** -0.5
                    out, lse = flash_attn_interface._flash_attn_forward(
                        q, k, v, softmax_scale=scale, causal=causal)[:2]
                    ctx.save_for_backward(q, k, v, out, lse)
                    ctx.scale = scale
                    return out

                @staticmethod
                def backward(ctx, do):
                    q, k, v, out, lse = ctx.saved_tensors
                    return bwd.backward(q, k, v, out, do, lse, causal, ctx.scale)
            return FA3.apply

        def f(q, k, v):
            if varlen is not None:
                o = flash_attn_interface.flash_attn_varlen_func(
                    q, k, v, varlen["cu"], varlen["cu"], varlen["max"], varlen["max"],
                    causal=causal)
            else:
                o = flash_attn_interface.flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o
        return f
    return make


def _ours(numerics):
    def make(causal, gqa, varlen=None):
        def f(q, k, v):
            if varlen is not None:
                return gproj_cuda.attention_varlen(q, k, v, varlen["cu"], varlen["cu"],
                                                   varlen["max"], varlen["max"], causal=causal,
                                                   numerics=numerics)
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
    except Exception as e:
        print(f"(fa3 unavailable: {type(e).__name__}: {e})")
    return impls


def varlen_lengths(total, mean, seed=0):
    """Sequence lengths drawn uniformly from [mean/4, 7 mean/4], summing exactly to ``total``."""
    g = torch.Generator().manual_seed(seed * 7919 + mean)
    lens, left = [], total
    while left > 0:
        n = int(torch.randint(max(1, mean // 4), 7 * mean // 4 + 1, (1,), generator=g))
        n = min(n, left)
        if left - n < mean // 4:        # no tiny last sequence: fold the remainder in
            n = left
        lens.append(n)
        left -= n
    return tuple(lens)


# Varlen mixes given length by length ("LxC+LxC": C sequences of L tokens each), e.g. a long
# document packed with short ones: lengths far from uniform, where a grid sized by the longest
# sequence wastes the most (bench/NOTES.md session 14). Their records carry varlen_mix.
MIX_LABELS = {}


def varlen_mix(spec):
    """Lengths of a mix "LxC+LxC+..." (C sequences of L tokens, in that order)."""
    lens = []
    for part in spec.split("+"):
        try:
            length, count = (int(x) for x in part.split("x"))
        except ValueError:
            raise ValueError(f"varlen mix {spec!r}: expected LxC+LxC..., "
                             "e.g. 8192x1+64x128") from None
        if length < 1 or count < 1:
            raise ValueError(f"varlen mix {spec!r}: lengths and counts must be >= 1")
        lens += [length] * count
    MIX_LABELS[tuple(lens)] = spec
    return tuple(lens)


def spec_shapes(quick=False, hdims=(64, 128, 256), seqlens=(1024, 2048, 4096, 8192, 16384),
                gqa=True, gqa_seqlens=(4096, 16384), varlen_means=(1024, 4096), tokens=16384,
                varlen_mixes=()):
    """(hdim, seqlen, causal, heads_k divisor, kind, lengths): B*N = tokens, H*d = width;
    kind "dense", "gqa" (heads_k = heads / 8) or "varlen" (lengths of the packed sequences: drawn
    around varlen_means, or given by varlen_mixes)."""
    if quick:
        return [(128, 4096, False, 1, "dense", None), (128, 4096, True, 1, "dense", None)]
    shapes = []
    for d in hdims:
        for n in seqlens:
            for causal in (False, True):
                shapes.append((d, n, causal, 1, "dense", None))
    dg = 128 if 128 in hdims else hdims[0]
    if gqa:
        for n in gqa_seqlens:
            for causal in (False, True):
                shapes.append((dg, n, causal, 8, "gqa", None))
    mixes = [varlen_lengths(tokens, m) for m in varlen_means] + [varlen_mix(x) for x in varlen_mixes]
    for lens in mixes:
        for causal in (False, True):
            shapes.append((dg, max(lens), causal, 1, "varlen", lens))
    return shapes


def shape_flops(batch, heads, n, d, causal, op, lens=None):
    if lens is not None:
        return sum(flops(1, heads, m, m, d, causal, op) for m in lens)
    return flops(batch, heads, n, n, d, causal, op)


def bench_one(make, shape, ops, dtype=torch.bfloat16, tokens=16384, width=2048, warm_only=False,
              kmean=0.0):
    d, n, causal, hk_div, kind, lens = shape
    batch = len(lens) if lens else max(1, tokens // n)
    heads = width // d
    heads_k = max(1, heads // hk_div)
    dev = DEVICE
    g = torch.Generator(device=dev).manual_seed(0)
    lead = (sum(lens),) if lens else (batch, n)
    mk = lambda h: torch.randn(*lead, h, d, device=dev, generator=g).to(dtype)   # noqa: E731
    q, k, v = mk(heads), mk(heads_k), mk(heads_k)
    if kmean:  # keys with a common offset (the SPEC grid's kmean * a fixed +-1 vector per head)
        w = torch.randint(0, 2, (heads_k, d), device=dev, generator=g) * 2 - 1
        k = (k.float() + kmean * w).to(dtype)
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    do = mk(heads)
    varlen = None
    if lens:
        t = torch.tensor(lens)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int64)
        cu[1:] = torch.cumsum(t, 0)
        varlen = dict(cu=cu.to(torch.int32).to(dev), offsets=cu.to(dev), max=max(lens),
                      lens=list(lens), doc=torch.repeat_interleave(torch.arange(len(lens)), t).to(dev))
    f = make(causal, hk_div > 1, varlen)
    res = {}
    if warm_only:            # compile only: one forward and one backward
        q.grad = k.grad = v.grad = None
        f(q, k, v).backward(do)
        _sync()
        return dict(batch=batch, heads=heads, heads_k=heads_k, times=res)
    if "fwd" in ops:
        with torch.no_grad():
            res["fwd"] = time_cuda(lambda: f(q, k, v))
    if "bwd" in ops or "fwd_bwd" in ops:
        try:
            out = f(q, k, v)
        except Exception as e:      # keep the forward's time when the backward cannot run
            if not res:
                raise
            print(f"    backward failed, forward kept ({type(e).__name__}: {str(e)[:120]})")
            return dict(batch=batch, heads=heads, heads_k=heads_k, times=res)

        def bwd():
            q.grad = k.grad = v.grad = None
            out.backward(do, retain_graph=True)
        try:
            res["bwd"] = time_cuda(bwd)
        except Exception as e:
            if not res:
                raise
            print(f"    backward failed, forward kept ({type(e).__name__}: {str(e)[:120]})")
            return dict(batch=batch, heads=heads, heads_k=heads_k, times=res)

        if "fwd_bwd" in ops:
            def fb():
                q.grad = k.grad = v.grad = None
                f(q, k, v).backward(do)
            res["fwd_bwd"] = time_cuda(fb)
    return dict(batch=batch, heads=heads, heads_k=heads_k, times=res)


def _ints(s):
    return tuple(int(x) for x in s.split(",") if x.strip())


def main(argv=None):
    global BUDGET_S, DEVICE, WARM_S
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--impls", default="all", help="comma list (default: all importable)")
    ap.add_argument("--ops", default="fwd,bwd")
    ap.add_argument("--hdims", default="64,128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--no-gqa", action="store_true")
    ap.add_argument("--gqa-seqlens", default="4096,16384", help="GQA shapes (d=128, heads_k=H/8)")
    ap.add_argument("--varlen-means", default="1024,4096",
                    help="mean sequence lengths of the varlen shapes (d=128); '' for none")
    ap.add_argument("--varlen-mixes", default="8192x1+64x128",
                    help="varlen shapes given length by length, comma-separated 'LxC+LxC' "
                         "(C sequences of L tokens); '' for none")
    ap.add_argument("--flex-hdims", default="",
                    help="run flex only at shapes with these head dims (it compiles per shape)")
    ap.add_argument("--tokens", type=int, default=16384, help="B*N per shape")
    ap.add_argument("--width", type=int, default=2048, help="H*d per shape")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--kmean", type=float, default=0.0,
                    help="key offset: k = N(0,1) + KMEAN w, w = +-1 per head and coordinate")
    ap.add_argument("--budget-s", type=float, default=1.0, help="timing seconds per op and impl")
    ap.add_argument("--warm-s", type=float, default=0.3,
                    help="seconds of back-to-back calls before each timed op: times in the\n"
                         "power-capped regime of a sustained load (time_cuda)")
    ap.add_argument("--pause", type=float, default=0.2, help="seconds between configurations")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every implementation this many times per shape, taking turns, "
                         "and keep the median (drift then hits all alike)")
    ap.add_argument("--warm-only", action="store_true",
                    help="one forward+backward per shape, no timing, no output (compile caches)")
    ap.add_argument("--shard", default="0/1", help="i/n: only every n-th shape from the i-th")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: code-path check with tiny --tokens/--width (timings meaningless)")
    ap.add_argument("--out", help="JSON records (SPEC.md section 8 schema), rewritten per shape")
    ap.add_argument("--md", help="Markdown table")
    ap.add_argument("--plot", help="PNG: TFLOPS ratio to cuDNN per shape")
    ap.add_argument("--render", metavar="JSON[,JSON...]",
                    help="no timing: merge these runs' records (e.g. the --shard parts of one "
                         "run) into --out, --md and --plot")
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render.split(","), args.out, args.md, args.plot, argv)
    BUDGET_S, DEVICE, WARM_S = args.budget_s, args.device, args.warm_s
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench/speed.py needs a CUDA GPU (or --device cpu for a code-path check).")
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    impls = available_impls()
    if args.impls != "all":
        impls = {k: v for k, v in impls.items() if k in args.impls.split(",")}
    ops = args.ops.split(",")
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    commit = _commit()
    flex_hdims = _ints(args.flex_hdims)
    records = []
    shapes = spec_shapes(args.quick, _ints(args.hdims), _ints(args.seqlens), not args.no_gqa,
                         _ints(args.gqa_seqlens), _ints(args.varlen_means), args.tokens,
                         [x for x in args.varlen_mixes.split(",") if x])
    si0, sn = (int(x) for x in args.shard.split("/"))
    shapes = shapes[si0::sn]
    print(f"{gpu}, torch {torch.__version__}, {len(shapes)} shapes x {len(impls)} impls"
          + (" (warm-only)" if args.warm_only else ""), flush=True)
    t_run = time.time()
    rounds = 1 if args.warm_only else max(1, args.rounds)
    for si, shape in enumerate(shapes):
        d, n, causal, hk_div, kind, lens = shape
        tag = f"[{si + 1}/{len(shapes)}] d={d} N={n} causal={causal} {kind}"
        # --rounds R: every implementation timed R times, taking turns, and each op's median over
        # the rounds kept: clock and thermal drift during a shape then hit all of them alike
        # (one pass per implementation left ratios to cuDNN drifting by 3-10% between runs).
        runs, failed = {}, set()
        for rnd in range(rounds):
            for name, (make, impl, numerics) in impls.items():
                if (impl == "flex" and flex_hdims and d not in flex_hdims) or name in failed:
                    continue
                t0 = time.time()
                try:
                    r = bench_one(make, shape, ops, dtype, args.tokens, args.width, args.warm_only,
                                  args.kmean)
                except Exception as e:
                    print(f"  {tag} {name}: skipped ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160] if str(e) else ''})", flush=True)
                    failed.add(name)
                    if DEVICE == "cuda":
                        torch.cuda.empty_cache()
                    continue
                if args.warm_only:
                    print(f"  {tag} {name}: warmed in {time.time() - t0:.1f} s", flush=True)
                    continue
                runs.setdefault(name, []).append(r)
                line = " ".join(f"{op} {r['times'][op]:.3f} ms "
                                f"({shape_flops(r['batch'], r['heads'], n, d, causal, op, lens) / r['times'][op] / 1e9:.0f} TF)"
                                for op in ops if op in r["times"])
                rtag = f" round {rnd + 1}/{rounds}" if rounds > 1 else ""
                print(f"  {tag} hk=H/{hk_div} {name:18s} {line} [{time.time() - t0:.1f} s]{rtag}",
                      flush=True)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
                time.sleep(args.pause)
        for name, rs in runs.items():
            _, impl, numerics = impls[name]
            r = rs[0]
            for op in r["times"]:
                ms = statistics.median(x["times"][op] for x in rs if op in x["times"])
                fl = shape_flops(r["batch"], r["heads"], n, d, causal, op, lens)
                rec = dict(impl=impl, numerics=numerics, op=op, dtype=args.dtype, hdim=d,
                           seqlen=n, batch=r["batch"], heads=r["heads"], heads_k=r["heads_k"],
                           causal=causal, ms=ms, tflops=fl / ms / 1e9, gpu=gpu,
                           torch=torch.__version__, commit=commit, shape=kind, rounds=len(rs))
                if args.kmean:
                    rec.update(kmean=args.kmean)
                if lens:
                    rec.update(tokens=sum(lens), seqlens_mean=round(sum(lens) / len(lens)))
                    if tuple(lens) in MIX_LABELS:
                        rec.update(varlen_mix=MIX_LABELS[tuple(lens)])
                records.append(rec)
        if args.out and records:
            with open(args.out + ".tmp", "w") as f:
                json.dump(records, f, indent=1)
            os.replace(args.out + ".tmp", args.out)
    print(f"done: {len(shapes)} shapes in {time.time() - t_run:.0f} s", flush=True)
    if args.warm_only:
        return 0
    write_table(records, args.md, args.plot,
                f"`python bench/speed.py {' '.join(argv or sys.argv[1:])}`")
    return 0


def _kind(r):
    return r.get("shape") or ("gqa" if r["heads_k"] != r["heads"] else "dense")


def _key(r):
    return (r["hdim"], r["seqlen"], r["causal"], _kind(r), r["op"])


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
    head = "| hdim | N | causal | shape | op | " + " | ".join(impls) + " |"
    lines = [head, "|" + "---|" * (5 + len(impls))]
    for key in sorted(rows, key=lambda k: (k[3] != "dense", k[3], k[0], k[1], k[2], k[4])):
        vals = rows[key]
        # varlen: SDPA runs through nested tensors there (overhead-bound): TFLOPS only
        ref = vals.get("sdpa_cudnn") if key[3] != "varlen" else None
        cells = []
        for i in impls:
            if i not in vals:
                cells.append("-")
            elif ref and i != "sdpa_cudnn":
                cells.append(f"{vals[i]:.0f} ({vals[i] / ref:.2f}x)")
            else:
                cells.append(f"{vals[i]:.0f}")
        d, n, causal, kind, op = key
        lines.append(f"| {d} | {n} | {causal} | {kind} | {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nTFLOPS (ratio to cuDNN in the same run). varlen rows: N is the "
                                "longest packed sequence; FLOPs summed per sequence; no ratios (SDPA runs "
                                "them through nested tensors, whose overhead sets its time).\n")


def render(paths, out, md, png, argv):
    """--render: the records of several JSON files (one run's --shard parts) as one table."""
    records = []
    for path in paths:
        with open(path) as f:
            records += json.load(f)
    if not records:
        print("bench/speed.py --render: no records in " + ", ".join(paths))
        return 2
    if out:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)
    write_table(records, md, png,
                f"merged by `python bench/speed.py {' '.join(argv or sys.argv[1:])}`")
    return 0


def write_table(records, md, png, command):
    """The Markdown table (printed; to `md` under a line naming the machine, torch and commit of
    the records' runs and `command`) and the plot (`png`)."""
    table = markdown(records)
    print(table)
    if md:
        runs = sorted({(r["gpu"], r["torch"], str(r["commit"])) for r in records})
        with open(md, "w") as f:
            f.write("Measured on " + "; ".join(f"{g}, torch {t}, commit {c}" for g, t, c in runs)
                    + f", {command}\n\n" + table)
    if png:
        plot(records, png)


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 1, figsize=(16, 10), sharey=True)
    # one colour per implementation in both panels (the backward has no FA3 line: a panel's own
    # colour cycle would give its lines the forward's colours of other implementations)
    label = lambda r: r["impl"] + (f"/{r['numerics']}" if r["numerics"] else "")  # noqa: E731
    colors = {n: f"C{i}" for i, n in enumerate(sorted({label(r) for r in records}))}
    for ax, op in zip(axes, ("fwd", "bwd")):
        rs = [r for r in records if r["op"] == op]
        cudnn = {_key(r): r["tflops"] for r in rs if r["impl"] == "sdpa_cudnn"}
        # varlen rows left out: SDPA takes them through nested tensors, whose overhead (not the
        # kernels) sets its time there, so a ratio to it would mislead (see speed.md)
        keys = sorted({_key(r) for r in rs if _kind(r) != "varlen"},
                      key=lambda k: (k[3] != "dense", k[3], k[0], k[1], k[2]))
        names = sorted({label(r) for r in rs})
        for name in names:
            ys = []
            for key in keys:
                m = [r["tflops"] for r in rs if _key(r) == key and label(r) == name]
                ys.append(m[0] / cudnn[key] if m and key in cudnn else math.nan)
            ax.plot(range(len(keys)), ys, marker="o", label=name, color=colors[name])
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels([f"d{k[0]} N{k[1] / 1024:.3g}k{' c' if k[2] else ''}{'' if k[3] == 'dense' else ' ' + k[3]}"
                            for k in keys], rotation=70, fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_title(f"{op}: TFLOPS / cuDNN (same run; varlen shapes in speed.md)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
