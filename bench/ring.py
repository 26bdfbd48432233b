"""Context-parallel (ring) attention on several GPUs: scaling table and a correctness check.

    python bench/ring.py                                   # every visible GPU, 32k-128k tokens
    python bench/ring.py --worlds 1,2 --tokens 32768,65536,131072 \
        --out bench/results/ring.json --md bench/results/ring.md --plot bench/results/ring.png
    python bench/ring.py --smoke                           # CPU: gloo + emulator, tiny shapes

One process per GPU (NCCL). For each world size W and total sequence length T (batch 1, the
sequence split over the W ranks), time ``gproj_cuda.distributed.ring_attention`` forward and
forward+backward with CUDA events (median over repetitions, all ranks synchronized by a barrier
before each repetition; the slowest rank's time counts), and report tokens/s = T / time and
TFLOPS = 4·H·T²·d (/2 causal; fwd+bwd 3.5x) / time. Causal runs use the zigzag layout (balanced
work), non-causal ones the contiguous layout. Before timing, each world size checks its output and
gradients against the single-GPU op on the rank-0 GPU at the smallest T (median row-relative
difference, printed and recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import commit as _commit  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gproj_cuda  # noqa: E402
from gproj_cuda import distributed as D  # noqa: E402
from gproj_cuda.metrics import row_rel_err  # noqa: E402


def _flops(T, H, d, causal, op):
    f = 4.0 * H * T * T * d / (2 if causal else 1)
    return f * (3.5 if op == "fwd_bwd" else 1.0)


def _inputs(T, H, Hk, d, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda h: torch.randn(1, T, h, d, generator=g).to(torch.bfloat16).to(device)  # noqa: E731
    return mk(H), mk(Hk), mk(Hk), mk(H)


def _time(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        el = torch.tensor([time.perf_counter() - t0], device="cuda")
        dist.all_reduce(el, op=dist.ReduceOp.MAX)   # the slowest rank's time
        times.append(el.item() * 1e3)
    return statistics.median(times)


def _worker(rank, world, init_file, args, out_file):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    H, Hk, d = args.heads, args.heads_k, args.hdim
    records = []
    try:
        # Correctness at the smallest length, both masks, against the one-GPU op.
        T0 = min(args.tokens)
        for causal in (False, True):
            layout = "zigzag" if causal else "contiguous"
            q, k, v, do = _inputs(T0, H, Hk, d, dev)
            loc = [D.shard(t, rank, world, layout).clone().requires_grad_(i < 3)
                   for i, t in enumerate((q, k, v, do))]
            out = D.ring_attention(*loc[:3], causal=causal, layout=layout)
            out.backward(loc[3])
            got = {}
            for name, t in (("out", out), ("dq", loc[0].grad), ("dk", loc[1].grad),
                            ("dv", loc[2].grad)):
                parts = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(parts, t.detach().contiguous())
                got[name] = D.unshard(parts, layout)
            if rank == 0:
                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                o1 = gproj_cuda.attention(qq, kk, vv, causal=causal)
                o1.backward(do)
                ref = dict(out=o1, dq=qq.grad, dk=kk.grad, dv=vv.grad)
                diffs = {n: row_rel_err(got[n].float(), ref[n].float()) for n in ref}
                print(f"[W={world}] check T={T0} causal={causal}: ring vs one GPU "
                      + ", ".join(f"{n} {e:.2e}" for n, e in diffs.items()), flush=True)
                records.append(dict(kind="check", world=world, tokens=T0, causal=causal,
                                    layout=layout, **{f"{n}_diff": e for n, e in diffs.items()}))
            del q, k, v, do, loc, out, got
        for T in args.tokens:
            for causal in args.causal:
                layout = "zigzag" if causal else "contiguous"
                q, k, v, do = (D.shard(t, rank, world, layout).contiguous()
                               for t in _inputs(T, H, Hk, d, dev))
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

                def fwd():
                    with torch.no_grad():
                        D.ring_attention(q, k, v, causal=causal, layout=layout, check_group=False)

                def fwd_bwd():
                    o = D.ring_attention(q, k, v, causal=causal, layout=layout, check_group=False)
                    o.backward(do)

                for op, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
                    ms = _time(fn, args.reps)
                    if rank == 0:
                        rec = dict(kind="speed", impl="gproj_ring", numerics="gproj", op=op,
                                   world=world, tokens=T, heads=H, heads_k=Hk, hdim=d,
                                   causal=causal, layout=layout, dtype="bf16", ms=ms,
                                   tokens_per_s=T / (ms / 1e3),
                                   tflops=_flops(T, H, d, causal, op) / (ms / 1e3) / 1e12)
                        records.append(rec)
                        print(f"[W={world}] T={T:>6} causal={int(causal)} {op:7s} {ms:9.2f} ms  "
                              f"{rec['tokens_per_s']:11.0f} tok/s  {rec['tflops']:6.1f} TFLOPS "
                              f"(total, {rec['tflops'] / world:6.1f} per GPU)", flush=True)
                del q, k, v, do
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(records, f)


def _smoke():
    """CPU: two gloo ranks, emulator, a tiny causal zigzag problem vs the one-device emulator."""
    import subprocess
    code = ("import sys; sys.argv=['pytest']; import pytest; "
            "sys.exit(pytest.main(['-q', 'tests/test_distributed.py', '-k', 'cpu and 2']))")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.exit(subprocess.call([sys.executable, "-c", code], cwd=root))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default=None, help="comma list of GPU counts (default 1..all)")
    ap.add_argument("--tokens", default="32768,65536,131072")
    ap.add_argument("--causal", default="0,1", help="comma list of 0/1")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-k", type=int, default=16)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out"), ap.add_argument("--md"), ap.add_argument("--plot")
    args = ap.parse_args()
    if args.smoke:
        _smoke()
    if not torch.cuda.is_available() or not gproj_cuda.is_available():
        sys.exit(f"bench/ring.py needs CUDA GPUs and the kernels ({gproj_cuda.unavailable_reason()}); "
                 "--smoke runs the CPU check")
    n_gpu = torch.cuda.device_count()
    worlds = [int(w) for w in args.worlds.split(",")] if args.worlds else list(range(1, n_gpu + 1))
    worlds = [w for w in worlds if w <= n_gpu]
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.causal = [bool(int(c)) for c in args.causal.split(",")]
    for T in args.tokens:
        for w in worlds:
            if T % (2 * w):
                sys.exit(f"--tokens {T} must be divisible by 2 x {w} GPUs")
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, commit=_commit())
    records = []
    for w in worlds:
        print(f"== world size {w} ==", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            out_file = os.path.join(tmp, "out.json")
            mp.spawn(_worker, args=(w, os.path.join(tmp, "init"), args, out_file), nprocs=w,
                     join=True)
            with open(out_file) as f:
                records += [dict(r, **meta) for r in json.load(f)]
        if args.out:
            with open(args.out, "w") as f:
                json.dump(records, f, indent=1)
    table = _markdown(records, meta)
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table)
    if args.plot:
        _plot(records, args.plot)


def _markdown(records, meta):
    speed = [r for r in records if r["kind"] == "speed"]
    base = {(r["tokens"], r["causal"], r["op"]): r["ms"] for r in speed if r["world"] == 1}
    lines = [f"Ring attention (gproj numerics, bf16, H={speed[0]['heads'] if speed else '?'}, "
             f"d={speed[0]['hdim'] if speed else '?'}), {meta['gpu']}, torch {meta['torch']}, "
             f"commit {meta['commit']}\n",
             "| tokens | causal (layout) | op | GPUs | ms | tokens/s | TFLOPS total | speed-up vs 1 GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in sorted(speed, key=lambda r: (r["tokens"], r["causal"], r["op"], r["world"])):
        b = base.get((r["tokens"], r["causal"], r["op"]))
        su = f"{b / r['ms']:.2f}x" if b else "-"
        lines.append(f"| {r['tokens']} | {int(r['causal'])} ({r['layout']}) | {r['op']} | "
                     f"{r['world']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | "
                     f"{r['tflops']:.0f} | {su} |")
    checks = [r for r in records if r["kind"] == "check"]
    if checks:
        lines += ["", "Ring vs one GPU (median row-relative difference):", "",
                  "| GPUs | tokens | causal | out | dq | dk | dv |", "|---|---|---|---|---|---|---|"]
        for r in checks:
            lines.append(f"| {r['world']} | {r['tokens']} | {int(r['causal'])} | "
                         f"{r['out_diff']:.1e} | {r['dq_diff']:.1e} | {r['dk_diff']:.1e} | "
                         f"{r['dv_diff']:.1e} |")
    return "\n".join(lines) + "\n"


def _plot(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    speed = [r for r in records if r["kind"] == "speed" and r["op"] == "fwd_bwd"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for T in sorted({r["tokens"] for r in speed}):
        for causal in (False, True):
            pts = sorted((r["world"], r["tokens_per_s"]) for r in speed
                         if r["tokens"] == T and r["causal"] == causal)
            if pts:
                ax.plot(*zip(*pts), marker="o", ls="-" if causal else "--",
                        label=f"{T // 1024}k {'causal' if causal else 'full'}")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s (forward+backward)")
    ax.set_title("gproj ring attention scaling")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
