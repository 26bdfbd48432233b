"""End-to-end training-step time of a ~410M-parameter GPT with each attention implementation.

    python bench/train_step.py --smoke              # CPU check: 2-layer tiny model, 2 steps
    python bench/train_step.py --out bench/results/train_step.json --md bench/results/train_step.md

Model: GPT, 24 layers, width 1024, 16 heads of 64, MLP 4x (GELU), vocab 50304, pre-norm
(LayerNorm), learned positions, untied output head, no biases in the linear layers (24·12·1024²
+ 2·50304·1024 + positions ≈ 410M parameters). Causal attention through
``--impls`` (comma list):

    gproj       gproj_cuda.attention(numerics="gproj")   exact-max forward + GProj backward
    fa3mode     gproj_cuda.attention(numerics="fa3")     FA3's arithmetic in the same kernels
    sdpa_cudnn  torch SDPA, cuDNN backend                 the fastest peer on Hopper
    sdpa_flash  torch SDPA, flash (FA2) backend           (optional)

Step = forward + cross-entropy + backward + AdamW (fused=True on CUDA) + zero_grad, in BF16
autocast (fp32 master weights), on random token ids; tokens per step fixed (--tokens, default
16384), so batch = tokens / seqlen. One model and optimizer serve every implementation (the
attention function is switched between steps); the implementations are interleaved in rounds
(--rounds) so clock drift hits them alike. After warm-up, every step is timed with CUDA events and
the median is reported. The GProj overhead is (step_ms(gproj) / step_ms(other) - 1) in percent;
SPEC.md section 6: <= 4.7% vs fa3 mode, aiming at 3%.

Before timing, each sequence length prints the forward loss of every implementation on the same
weights and batch: they must agree (a sanity check that every implementation is wired right).
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
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gproj_cuda  # noqa: E402

IMPLS = {  # name -> (record impl, record numerics)
    "gproj": ("gproj_cuda", "gproj"),
    "fa3mode": ("gproj_cuda", "fa3"),
    "sdpa_cudnn": ("sdpa_cudnn", None),
    "sdpa_flash": ("sdpa_flash", None),
}




def attention(impl, q, k, v):
    """Causal attention, q, k, v and the result in (B, N, H, d)."""
    if impl == "gproj":
        return gproj_cuda.attention(q, k, v, causal=True, numerics="gproj")
    if impl == "fa3mode":
        return gproj_cuda.attention(q, k, v, causal=True, numerics="fa3")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_flash": SDPBackend.FLASH_ATTENTION}[impl]
    with sdpa_kernel([backend]):
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x, impl):
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, c // self.heads).unbind(2)
        y = attention(impl, q, k, v)
        x = x + self.proj(y.reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, max_seq):
        super().__init__()
        self.impl = "gproj"                      # switched between steps
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.impl)
        return self.head(self.ln_f(x))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check: 2 layers, width 128, vocab 512, N=64,128, 2 timed steps")
    ap.add_argument("--impls", default="gproj,fa3mode,sdpa_cudnn",
                    help=f"comma list of {','.join(IMPLS)} (default gproj,fa3mode,sdpa_cudnn)")
    ap.add_argument("--seqlens", default="2048,4096")
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per step (batch = tokens/N)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per impl before round 1")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per impl per round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds over the impls")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model: one graph per impl and N, compiled in the "
                         "first warm-up step (about a minute each on the GPU machine: run one N "
                         "per command)")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON records (SPEC.md section 8 schema + extra fields)")
    ap.add_argument("--md", help="Markdown table")
    args = ap.parse_args(argv)
    given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
    if args.smoke:
        args.device = "cpu"
        defaults = dict(layers=2, dim=128, heads=2, vocab=512, seqlens="64,128", tokens=256,
                        warmup=1, steps=2, rounds=1)
        for key, val in defaults.items():
            if "--" + key not in given:
                setattr(args, key, val)
    args.seqlens = [int(x) for x in args.seqlens.split(",")]
    args.impls = [x.strip() for x in args.impls.split(",")]
    return args


class Timer:
    def __init__(self, cuda):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            self.a, self.b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            self.ms = self.a.elapsed_time(self.b)
        else:
            self.ms = 1e3 * (time.perf_counter() - self.t)


def _pctl(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]


def main(argv=None):
    args = parse(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    if not cuda and not args.smoke:
        print("note: no GPU; the default 24-layer model on the CPU emulator would take hours. "
              "Use --smoke.")
        return 2
    unknown = [i for i in args.impls if i not in IMPLS]
    if unknown:
        print(f"unknown impls {unknown}; choose from {list(IMPLS)}")
        return 2
    impls = list(args.impls)
    if not cuda:
        skipped = [i for i in impls if i.startswith("sdpa_")]
        if skipped:
            print(f"note: {', '.join(skipped)} need CUDA (torch SDPA cuDNN / flash backends); "
                  "skipped on CPU")
        impls = [i for i in impls if not i.startswith("sdpa_")]
        print("note: on CPU the gproj_cuda impls run the emulator (slow, exact arithmetic); "
              "the times say nothing about GPU speed")
    elif not gproj_cuda.is_available() and any(i in ("gproj", "fa3mode") for i in impls):
        print(f"note: gproj_cuda kernels unavailable ({gproj_cuda.unavailable_reason()}); "
              "dropping gproj / fa3mode")
        impls = [i for i in impls if i not in ("gproj", "fa3mode")]
    if not impls:
        print("nothing to run")
        return 2
    torch.manual_seed(args.seed)
    gpu = torch.cuda.get_device_name() if cuda else None
    commit = _commit()
    cmd = "python bench/train_step.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.time()

    with torch.device(device):
        model = GPT(args.layers, args.dim, args.heads, args.vocab, max(args.seqlens))
    nparams = sum(p.numel() for p in model.parameters())
    model_name = (f"gpt-{args.layers}L-{args.dim}d-{args.heads}h-v{args.vocab} "
                  f"({nparams / 1e6:.3g}M)")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    run_model = model
    if args.compile:
        import torch._dynamo as dynamo
        dynamo.config.cache_size_limit = 64
        run_model = torch.compile(model, dynamic=False)
    amp = torch.autocast(device_type=device, dtype=torch.bfloat16)
    print(f"{gpu or 'CPU'}, torch {torch.__version__}, commit {commit}: {model_name}, "
          f"{args.tokens} tokens/step, seqlens {args.seqlens}, impls {impls}, "
          f"{args.warmup} warm-up + {args.rounds}x{args.steps} timed steps each", flush=True)

    def step(idx, tgt):
        with amp:
            logits = run_model(idx)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def save(records):
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(records, f, indent=1)

    records = []
    for n in args.seqlens:
        batch = max(1, args.tokens // n)
        g = torch.Generator(device=device).manual_seed(args.seed + n)
        data = torch.randint(0, args.vocab, (batch, n + 1), device=device, generator=g)
        idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        # sanity: every implementation gives the same forward loss on the same weights and batch
        losses, failed = {}, {}
        with torch.no_grad():
            for impl in impls:
                model.impl = impl
                try:
                    with amp:
                        logits = model(idx)               # eager: no extra compiled graphs
                        losses[impl] = float(F.cross_entropy(logits.float().view(-1, args.vocab),
                                                             tgt.view(-1)))
                    del logits
                except Exception as e:
                    failed[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        print(f"N={n} batch={batch}: forward loss " +
              ", ".join(f"{i} {v:.5f}" for i, v in losses.items()), flush=True)
        live = [i for i in impls if i not in failed]
        times = {i: [] for i in live}
        peak, last_loss = {}, {}
        for rnd in range(args.rounds):
            for impl in live:
                if impl in failed:
                    continue
                model.impl = impl
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.time()
                try:
                    for _ in range(args.warmup if rnd == 0 else 1):
                        step(idx, tgt)
                    for _ in range(args.steps):
                        with Timer(cuda) as tm:
                            loss = step(idx, tgt)
                        times[impl].append(tm.ms)
                except Exception as e:
                    failed[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
                    opt.zero_grad(set_to_none=True)
                    if cuda:
                        torch.cuda.empty_cache()
                    continue
                last_loss[impl] = float(loss.detach())
                if cuda:
                    peak[impl] = max(peak.get(impl, 0.0), torch.cuda.max_memory_allocated() / 2**30)
                cur = times[impl][-args.steps:]
                print(f"  N={n} round {rnd + 1}/{args.rounds} {impl:10s} median "
                      f"{statistics.median(cur):8.2f} ms/step (min {min(cur):.2f}), loss "
                      f"{last_loss[impl]:.4f}  [{time.time() - t0:.1f} s, total "
                      f"{time.time() - t_start:.0f} s]", flush=True)
        for impl, why in failed.items():
            print(f"  N={n} {impl}: FAILED, left out ({why})", flush=True)
        for impl in live:
            if impl in failed or not times[impl]:
                continue
            ts = times[impl]
            ms = statistics.median(ts)
            rimpl, numerics = IMPLS[impl]
            records.append(dict(model=model_name, impl=rimpl, numerics=numerics, seqlen=n,
                                batch=batch, step_ms=ms, tokens_per_s=batch * n / (ms / 1e3),
                                gpu=gpu, commit=commit, name=impl, params=nparams,
                                step_ms_p10=_pctl(ts, 0.1), step_ms_p90=_pctl(ts, 0.9),
                                timed_steps=len(ts), peak_mem_gib=peak.get(impl),
                                forward_loss=losses[impl], final_loss=last_loss[impl],
                                compile=args.compile, torch=torch.__version__, device=device))
        if cuda:
            torch.cuda.empty_cache()
        save(records)

    table = markdown(records)
    print()
    print(table)
    save(records)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"Measured on {gpu or 'CPU (emulator; times meaningless)'}, torch "
                    f"{torch.__version__}, commit {commit}, `{cmd}`; {model_name}, BF16 autocast, "
                    f"AdamW{' (fused)' if cuda else ''}, {args.tokens} tokens/step, median of "
                    f"{args.rounds}x{args.steps} timed steps after warm-up"
                    f"{', torch.compile' if args.compile else ', eager'}; "
                    f"{time.time() - t_start:.0f} s.\n\n" + table)
    if args.out or args.md:
        print("wrote " + ", ".join(p for p in (args.out, args.md) if p))
    return 0


def overheads(records):
    """{seqlen: {other: percent}}: gproj step time over each other impl's, minus 1."""
    out = {}
    for n in sorted({r["seqlen"] for r in records}):
        by = {r["name"]: r["step_ms"] for r in records if r["seqlen"] == n}
        if "gproj" in by:
            out[n] = {o: 100 * (by["gproj"] / by[o] - 1) for o in by if o != "gproj"}
    return out


def markdown(records):
    lines = ["| N | batch | impl | step ms (median) | p10-p90 | tokens/s | vs cuDNN | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sorted({r["seqlen"] for r in records}):
        rs = [r for r in records if r["seqlen"] == n]
        cud = next((r["step_ms"] for r in rs if r["name"] == "sdpa_cudnn"), None)
        for r in rs:
            rel = f"{r['step_ms'] / cud:.3f}x" if cud else "-"
            mem = f"{r['peak_mem_gib']:.1f}" if r.get("peak_mem_gib") else "-"
            lines.append(f"| {n} | {r['batch']} | {r['name']} | {r['step_ms']:.2f} | "
                         f"{r['step_ms_p10']:.2f}-{r['step_ms_p90']:.2f} | "
                         f"{r['tokens_per_s']:,.0f} | {rel} | {mem} |")
    ov = overheads(records)
    if ov:
        lines.append("")
        lines.append("GProj overhead, percent of step time (SPEC.md section 6 bar: ≤ 4.7% vs fa3 "
                     "mode, aim 3%):")
        lines.append("")
        others = sorted({o for d in ov.values() for o in d})
        lines.append("| N | " + " | ".join(f"gproj vs {o}" for o in others) + " |")
        lines.append("|---|" + "---|" * len(others))
        for n, d in ov.items():
            cells = []
            for o in others:
                if o not in d:
                    cells.append("-")
                    continue
                mark = (" (meets ≤ 4.7%)" if d[o] <= 4.7 else " (over 4.7%)") if o == "fa3mode" else ""
                cells.append(f"{d[o]:+.1f}%{mark}")
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
