"""From-scratch pretraining: FA3's BF16 attention arithmetic vs GProj vs FP32 attention (issue 6).

    python bench/pretrain.py --smoke --arm gproj    # CPU check: tiny model, 6 steps, seconds;
                                                    # logs in /tmp/gproj_pretrain/smoke
    python bench/plot_pretrain.py --smoke-dir /tmp/gproj_pretrain/smoke
    python bench/pretrain.py --arm fa3 --workdir runs/x            # one arm on the GPU
    python bench/pretrain.py --arm gproj --workdir runs/x --stress all
    python bench/plot_pretrain.py runs/x                          # PNGs, one line per arm

bench/PRETRAIN.md has the GPU commands, their expected run times and the results.

The claim under test (SPEC.md section 2): with FlashAttention-3's BF16 arithmetic the attention
gradients drift off during pretraining (the keys' mean/spread ratio grows, the keys' common
gradient sum_j dK_j stops being zero, the dQ error grows, the gradient norm rises) while GProj
tracks FP32 attention. Three arms, identical in everything but the attention call (same seed,
same initial weights, same data order, BF16 autocast elsewhere, AdamW):

    fa3    gproj_cuda.attention(q, k, v, causal=True, numerics="fa3")
    gproj  gproj_cuda.attention(q, k, v, causal=True, numerics="gproj")
    fp32   q, k, v upcast to float32, torch SDPA math backend (autocast off, TF32 off), cast back

Model: GPT, pre-norm LayerNorm, no QK-norm, learned positions, GELU MLP 4x, untied head, learned
q/k/v biases (--qkv-bias, default on; the key bias is a separate parameter so that --stress
keybias can initialise it large and give it its own LR multiplier), no other linear biases.
Default 10 layers, width 640, 10 heads of 64: 50.2M parameters. Head dim (width / heads) must be
64, 128 or 256 (what gproj_cuda supports); up to the shape of bench/train_step.py with --layers 24
--dim 1024 --heads 16 (305M parameters here: byte vocabulary instead of 50304 tokens).

Data: the Python standard library's *.py files (source and docstrings; site-packages,
dist-packages, __pycache__, config-*, _sysconfigdata*, idlelib and turtledemo left out), as raw
bytes (vocab 256), one NUL byte between files. A file goes to validation when
sha1(relative path) % 100 < --val-pct (default 5), so the split does not depend on the file
contents or the order of the walk. Training batch of step s: --tokens / --seqlen windows of
--seqlen+1 bytes at offsets drawn from a generator seeded with (--seed, s): the data order
depends on the seed and the step only, identical for every arm and after --resume. Validation:
--eval-batches fixed batches at evenly spaced offsets of the validation stream. The dataset's
sha256 is printed and written to NAME.meta.json: compare it between arms (all arms must run
with the same Python).

Logged every --log-every steps (and on every --eval-every step) to WORKDIR/NAME.jsonl (one JSON
record per line; per-layer statistics in a "layers" list) and WORKDIR/NAME.csv (the same, per
layer flattened to L<i>_<stat>), NAME = --name or "<arm>-<stress>":

    step, tokens, elapsed_s, tok_per_s, lr, train_loss (mean since the last record),
    train_loss_step, val_loss (on eval steps, else null), grad_norm (global, before clipping;
    mean since the last record), grad_norm_step, grad_norm_max, and per layer, on the first
    --diag-seqs sequences of the step's own batch (weights before that step's update):
      key_ratio     ||k_mean|| / rms ||k_j - k_mean|| (mean over positions), max over heads
      query_ratio   the same for q
      max_prob      mean over rows of the largest attention probability (float64), max over heads
      rowsum_res    median over rows of |sum_j bf16(dS)_ij| / sum_j |dS_ij| (float64 dS), max
                    over heads: how much the BF16 rounding alone breaks the softmax law here
      kbias_rms     rms of the key bias parameter (null without --qkv-bias)
      sumdk         |sum_j dK_j| / sum_j ||dK_j|| of the dK the arm actually produced (tensor hook
                    on k; the BF16 gradient the model receives), max over sequences and heads
      sumdk_fp32    the same for an FP32 recomputation of this layer's attention backward on the
                    same (rounded) q, k, v, dO (gproj_cuda.reference.attention_grads in float32)
      sumdk_floor   the same for the float64 reference dK rounded to BF16: what a perfect kernel
                    that returns BF16 dK gives (the rounding floor, ~2^-9/sqrt(N))
      dq_err        median per-row relative error of the arm's dQ (tensor hook on q) against the
                    float64 reference on the same q, k, v, dO (metrics.row_rel_err), max over heads
      dq_err_fp32   the same for the FP32 recomputation (the floor of FP32 attention)
      dk_err        the arm's dK against float64, like dq_err
The per-layer statistics reuse gproj_cuda.diagnostics' mean/spread ratio and softmax statistics
and gproj_cuda.metrics; the capture is a small hook here rather than diagnostics._Capture,
because that one sees the fp32 arm's upcast float32 tensors (not the BF16 q, k the model's
parameters receive gradients through) and is made for a separate audit pass, not the training
step's own backward.

Stress presets (--stress; a flag given explicitly always wins over the preset):

    none     lr 1e-3, warm-up 200 steps, seqlen 1024, key bias initialised to 0, LR mult 1
    lr       peak lr 3e-3, warm-up 50 steps: faster logit growth, sharper attention sooner
    context  seqlen 2048 (batch halved: same tokens per step): more keys per row, larger dS
             row residuals
    keybias  key bias initialised along a fixed random +-1 direction per layer so that the
             keys start at mean/spread ratio ~8 (--kbias-init 8), LR multiplier 10 and no weight
             decay on it (--kbias-lr-mult 10): the key bias's exact gradient is sum_j dK_j = 0,
             so in exact arithmetic it does not move except by optimizer noise, while FA3's leak
             gives it a systematic gradient that AdamW turns into full-size steps
    all      lr + context + keybias

Budget: each run must fit one GPU command (< 10 min): --steps (default 3000, 16384 tokens per
step) sets the LR schedule; --time-budget-s (default 480, counted from the start of the process)
stops the loop cleanly, then the final evaluation, diagnostics, log records, checkpoint and
summary are written (--deadline, a Unix time, caps it too). A checkpoint (model, optimizer,
step) goes to CKPT_DIR/NAME.ckpt.pt (--ckpt-dir, default WORKDIR) every --ckpt-every steps;
--resume continues from it (the logs are cut back to the checkpoint's step).
The GPU machine keeps nothing between commands: there, the logs are what comes back.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _common import commit as _commit  # noqa: E402

import gproj_cuda  # noqa: E402
from gproj_cuda import metrics, reference  # noqa: E402
from gproj_cuda.diagnostics import _mean_spread_ratio, _quiet_math, _softmax_stats  # noqa: E402
from gproj_cuda.masks import normalize_window  # noqa: E402

ARMS = ("fa3", "gproj", "fp32")
HEAD_DIMS = (64, 128, 256)
STRESS = {
    "none": {},
    "lr": dict(lr=3e-3, warmup=50),
    "context": dict(seqlen=2048),
    "keybias": dict(kbias_init=8.0, kbias_lr_mult=10.0),
}
STRESS["all"] = {**STRESS["lr"], **STRESS["context"], **STRESS["keybias"]}
LAYER_STATS = ("key_ratio", "query_ratio", "max_prob", "rowsum_res", "kbias_rms", "sumdk",
               "sumdk_fp32", "sumdk_floor", "dq_err", "dq_err_fp32", "dk_err")
TOP_COLUMNS = ("run", "arm", "stress", "step", "tokens", "elapsed_s", "tok_per_s", "lr",
               "train_loss", "train_loss_step", "val_loss", "grad_norm", "grad_norm_step",
               "grad_norm_max")
EXCLUDE_DIRS = {"site-packages", "dist-packages", "__pycache__", "idlelib", "turtledemo"}
_NAN = float("nan")


# --------------------------------------------------------------------------------------------
# Data: the standard library's source, byte tokens
# --------------------------------------------------------------------------------------------

def load_corpus(root=None, val_pct=5):
    """(train bytes, val bytes, info): every *.py under the stdlib root, split by path hash."""
    root = root or os.path.dirname(os.__file__)
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in EXCLUDE_DIRS and not d.startswith("config-"))
        for f in sorted(filenames):
            if f.endswith(".py") and not f.startswith("_sysconfigdata"):
                paths.append(os.path.join(dirpath, f))
    train, val = bytearray(), bytearray()
    nval = 0
    for p in sorted(paths, key=lambda p: os.path.relpath(p, root)):
        rel = os.path.relpath(p, root).replace(os.sep, "/")
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % 100 < val_pct:
            val += data + b"\0"
            nval += 1
        else:
            train += data + b"\0"
    h = hashlib.sha256()
    h.update(bytes(train))
    h.update(b"|")
    h.update(bytes(val))
    info = dict(root=root, python=sys.version.split()[0], files=len(paths), val_files=nval,
                train_bytes=len(train), val_bytes=len(val), sha256=h.hexdigest()[:16])
    return bytes(train), bytes(val), info


class Data:
    def __init__(self, train, val, seqlen, batch, seed, eval_batches, device, steps):
        self.train = torch.frombuffer(bytearray(train), dtype=torch.uint8).to(device)
        self.val = torch.frombuffer(bytearray(val), dtype=torch.uint8).to(device)
        if len(self.val) < seqlen + 2 or len(self.train) < seqlen + 2:
            raise ValueError(f"corpus too small for seqlen {seqlen}")
        self.seqlen, self.batch, self.seed, self.device = seqlen, batch, seed, device
        self.ar = torch.arange(seqlen + 1, device=device)
        n = eval_batches * batch
        offs = torch.linspace(0, len(self.val) - seqlen - 2, n).long().to(device)
        w = self.val[offs[:, None] + self.ar].long()
        self.val_batches = [(w[i:i + batch, :-1], w[i:i + batch, 1:]) for i in range(0, n, batch)]
        # every step's offsets up front, moved to the device once: no host-device copy per step
        self.offsets = torch.stack([self._offsets(s) for s in range(steps)]).to(device)

    def _offsets(self, step):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.randint(0, len(self.train) - self.seqlen - 1, (self.batch,), generator=g)

    def batch_at(self, step):
        """The training batch of ``step``: depends on (seed, step) only."""
        offs = (self.offsets[step] if step < len(self.offsets)
                else self._offsets(step).to(self.device))
        w = self.train[offs[:, None] + self.ar].long()
        return w[:, :-1], w[:, 1:]


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------

def attend(arm, q, k, v):
    """Causal attention of (B, N, H, d) BF16 tensors through the arm's implementation."""
    if arm in ("fa3", "gproj"):
        # q, k, v are BF16 already. Autocast off: on CPU the op runs the emulator's Python
        # arithmetic, whose fp32 GEMMs autocast would round to BF16 (no effect on the GPU kernels)
        with torch.autocast(q.device.type, enabled=False):
            return gproj_cuda.attention(q, k, v, causal=True, numerics=arm)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # autocast would cast SDPA's inputs back to BF16: off; the math backend keeps them in fp32
    with torch.autocast(q.device.type, enabled=False), sdpa_kernel([SDPBackend.MATH]):
        y = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float().transpose(1, 2),
                                           v.float().transpose(1, 2), is_causal=True)
    return y.transpose(1, 2).to(q.dtype)


class Tap:
    """Diagnostic capture for one attention layer on one step: the first ``nseq`` sequences of
    q, k, v (as passed to attention) and, through tensor hooks, dO, and the dQ, dK the arm's
    backward produced."""

    def __init__(self, nseq):
        self.nseq, self.t = nseq, {}

    def attach(self, q, k, v, y):
        s = slice(0, self.nseq)
        for name, x in (("q", q), ("k", k), ("v", v)):
            self.t[name] = x[s].detach().clone()
        if y.requires_grad:
            for name, x in (("dq", q), ("dk", k), ("do", y)):
                x.register_hook(lambda g, name=name:
                                self.t.__setitem__(name, g[s].detach().clone()))


class Attention(nn.Module):
    def __init__(self, dim, heads, qkv_bias):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.k_bias = nn.Parameter(torch.zeros(dim))   # separate: own init / LR multiplier
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.k_bias = self.v_bias = None

    def forward(self, x, arm, tap=None):
        b, n, c = x.shape
        bias = None if self.k_bias is None else torch.cat([self.q_bias, self.k_bias, self.v_bias])
        q, k, v = F.linear(x, self.qkv.weight, bias).view(b, n, 3, self.heads, self.hd).unbind(2)
        y = attend(arm, q, k, v)
        if tap is not None:
            tap.attach(q, k, v, y)
        return self.proj(y.reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim, heads, qkv_bias):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, qkv_bias)
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x, arm, tap=None):
        x = x + self.attn(self.ln1(x), arm, tap)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, vocab, max_seq, qkv_bias, kbias_init, seed):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, qkv_bias) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                resid = name.endswith(("proj.weight", "fc2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if resid else 0.02)
        if qkv_bias and kbias_init:
            # keys = W_k LN(x) + b_k with W_k ~ N(0, 0.02^2): each key coordinate has std
            # 0.02 sqrt(dim), so |b| = kbias_init * that per coordinate gives mean/spread ~ init
            g = torch.Generator().manual_seed(seed + 7919)
            mag = kbias_init * 0.02 * math.sqrt(dim)
            with torch.no_grad():
                for blk in self.blocks:
                    # device="cpu": the model is built under torch.device("cuda"), and a CPU
                    # generator there fails ("Expected a 'cuda' device type for generator")
                    signs = torch.randint(0, 2, (dim,), generator=g, device="cpu").float() * 2 - 1
                    blk.attn.k_bias.copy_(mag * signs)

    def forward(self, idx, arm, taps=None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for i, blk in enumerate(self.blocks):
            x = blk(x, arm, None if taps is None else taps[i])
        return self.head(self.ln_f(x))


def param_groups(model, args):
    decay, no_decay, kbias = [], [], []
    for name, p in model.named_parameters():
        if name.endswith("k_bias"):
            kbias.append(p)
        elif p.dim() >= 2:
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [dict(params=decay, weight_decay=args.weight_decay, lr_mult=1.0),
              dict(params=no_decay, weight_decay=0.0, lr_mult=1.0)]
    if kbias:
        groups.append(dict(params=kbias, weight_decay=0.0, lr_mult=args.kbias_lr_mult))
    return groups


def lr_at(step, args):
    """Linear warm-up to --lr over --warmup steps, cosine to --min-lr-frac * lr at --steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t)))


# --------------------------------------------------------------------------------------------
# Per-layer diagnostics
# --------------------------------------------------------------------------------------------

def _max(xs):
    xs = [float(x) for x in xs if not math.isnan(float(x))]
    return max(xs) if xs else _NAN


def _per_head_err(g, ref):
    return _max(row_err for row_err in
                (metrics.row_rel_err(g[:, :, h], ref[:, :, h]) for h in range(g.shape[2])))


def layer_stats(t, scale, k_bias):
    """The per-layer statistics (see the module docstring) from one Tap's tensors."""
    out = {s: _NAN for s in LAYER_STATS}
    if k_bias is not None:
        out["kbias_rms"] = float(k_bias.detach().float().square().mean().sqrt())
    if "q" not in t:
        return out
    q, k, v = t["q"], t["k"], t["v"]
    with _quiet_math(q.device):
        out["key_ratio"] = _max(_mean_spread_ratio(k))
        out["query_ratio"] = _max(_mean_spread_ratio(q))
        do = t.get("do")
        left, right = normalize_window(True, (-1, -1))
        rd = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        maxp, _, res = _softmax_stats(q, k, v, do.to(rd) if do is not None else None, scale,
                                      left, right, rd)
        out["max_prob"], out["rowsum_res"] = _max(maxp), _max(res)
        if do is None or "dq" not in t or "dk" not in t:
            return out
        kw = dict(causal=True, softmax_scale=scale)
        _, _, rdq, rdk, _ = reference.attention_grads(q, k, v, do, **kw)            # float64
        _, _, fdq, fdk, _ = reference.attention_grads(q, k, v, do, compute_dtype=torch.float32,
                                                      **kw)                           # FP32
        out["sumdk"] = metrics.sum_dk_rel(t["dk"])
        out["sumdk_fp32"] = metrics.sum_dk_rel(fdk)
        out["sumdk_floor"] = metrics.sum_dk_rel(rdk.to(t["dk"].dtype))
        out["dq_err"] = _per_head_err(t["dq"], rdq)
        out["dq_err_fp32"] = _per_head_err(fdq, rdq)
        out["dk_err"] = _per_head_err(t["dk"], rdk)
    return out


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--arm", choices=ARMS, required=True, help="attention implementation")
    ap.add_argument("--stress", choices=tuple(STRESS), default="none", help="preset, see above")
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check: 2 layers, width 128, 2 heads, seqlen 64, batch 2, 6 steps")
    ap.add_argument("--workdir", default=None,
                    help="logs, checkpoint, summary (default: TMPDIR/gproj_pretrain, "
                         "TMPDIR/gproj_pretrain/smoke with --smoke)")
    ap.add_argument("--name", help="run name (default <arm>-<stress>)")
    ap.add_argument("--resume", action="store_true", help="continue from WORKDIR/NAME.ckpt.pt")
    g = ap.add_argument_group("model")
    g.add_argument("--layers", type=int, default=10)
    g.add_argument("--dim", type=int, default=640)
    g.add_argument("--heads", type=int, default=10, help="head dim = dim / heads: 64, 128, 256")
    g.add_argument("--qkv-bias", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--kbias-init", type=float, default=0.0,
                   help="initial key mean/spread ratio from the key bias (0: bias starts at 0)")
    g.add_argument("--kbias-lr-mult", type=float, default=1.0, help="LR multiplier of the key bias")
    g = ap.add_argument_group("training")
    g.add_argument("--steps", type=int, default=3000, help="optimizer steps (the LR schedule)")
    g.add_argument("--seqlen", type=int, default=1024)
    g.add_argument("--tokens", type=int, default=16384,
                   help="tokens per step (batch = tokens / seqlen)")
    g.add_argument("--lr", type=float, default=1e-3, help="peak LR")
    g.add_argument("--min-lr-frac", type=float, default=0.1)
    g.add_argument("--warmup", type=int, default=200)
    g.add_argument("--weight-decay", type=float, default=0.1, help="on matrices only")
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--grad-clip", type=float, default=1.0, help="0: no clipping")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--val-pct", type=int, default=5)
    g.add_argument("--time-budget-s", type=float, default=480.0,
                   help="stop the loop cleanly after this many seconds since process start")
    g.add_argument("--deadline", type=float, default=None,
                   help="also stop at this Unix time (a retry with --resume keeps the first "
                        "attempt's deadline)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g = ap.add_argument_group("logging")
    g.add_argument("--log-every", type=int, default=50)
    g.add_argument("--eval-every", type=int, default=250)
    g.add_argument("--eval-batches", type=int, default=8)
    g.add_argument("--diag-seqs", type=int, default=2,
                   help="sequences of the step's batch analysed per layer (all heads, all rows)")
    g.add_argument("--ckpt-every", type=int, default=500, help="steps between checkpoints; 0: none")
    g.add_argument("--ckpt-dir", help="where the checkpoint goes (default: --workdir); on the GPU "
                                      "machine somewhere outside $OUT (600 MB for 50M params)")
    g.add_argument("--tqdm", choices=("auto", "on", "off"), default="auto",
                   help="auto: a tqdm bar when tqdm imports and stderr is a terminal")
    args = ap.parse_args(argv)
    given = {a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:])
             if a.startswith("--")}

    def default(key, val):
        if "--" + key.replace("_", "-") not in given:
            setattr(args, key, val)
    for key, val in STRESS[args.stress].items():
        default(key, val)
    if args.smoke:
        for key, val in dict(device="cpu", layers=2, dim=128, heads=2, seqlen=64, tokens=128,
                             steps=6, warmup=2, log_every=2, eval_every=3, eval_batches=2,
                             diag_seqs=1, ckpt_every=3, time_budget_s=120.0).items():
            default(key, val)
        if args.stress in ("context", "all"):
            default("seqlen", 128)
    args.name = args.name or f"{args.arm}-{args.stress}"
    if args.workdir is None:
        args.workdir = os.path.join(tempfile.gettempdir(), "gproj_pretrain",
                                    *(("smoke",) if args.smoke else ()))
    if args.dim % args.heads or args.dim // args.heads not in HEAD_DIMS:
        ap.error(f"head dim = dim / heads must be one of {HEAD_DIMS}: got {args.dim} / "
                 f"{args.heads}")
    if args.kbias_init and not args.qkv_bias:
        ap.error("--kbias-init needs the key bias (--qkv-bias)")
    args.batch = max(1, args.tokens // args.seqlen)
    for key in ("steps", "log_every", "eval_every", "eval_batches", "diag_seqs", "warmup",
                "seqlen"):
        if getattr(args, key) < 1:
            ap.error(f"--{key.replace('_', '-')} must be >= 1")
    args.diag_seqs = min(args.diag_seqs, args.batch)
    return args


def _clean(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _fmt(x, spec=".4g"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


class Logs:
    """NAME.jsonl and NAME.csv under the workdir, appended record by record."""

    def __init__(self, workdir, name, layers, resume_step=None):
        self.jsonl = os.path.join(workdir, name + ".jsonl")
        self.csv = os.path.join(workdir, name + ".csv")
        self.columns = list(TOP_COLUMNS) + [f"L{i}_{s}" for i in range(layers) for s in LAYER_STATS]
        kept = []
        if resume_step is not None and os.path.exists(self.jsonl):
            with open(self.jsonl) as f:
                kept = [r for r in map(json.loads, filter(str.strip, f))
                        if r["step"] <= resume_step]
        with open(self.jsonl, "w") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")
        with open(self.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            for r in kept:
                w.writerow(self._row(r))

    def _row(self, rec):
        flat = {c: rec.get(c) for c in TOP_COLUMNS}
        for i, L in enumerate(rec.get("layers", [])):
            for s in LAYER_STATS:
                flat[f"L{i}_{s}"] = L.get(s)
        return ["" if flat.get(c) is None else flat[c] for c in self.columns]

    def write(self, rec):
        rec = {k: ([{a: _clean(b) for a, b in L.items()} for L in v] if k == "layers"
                   else _clean(v)) for k, v in rec.items()}
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        with open(self.csv, "a", newline="") as f:
            csv.writer(f).writerow(self._row(rec))


def _progress(args, start, total):
    use = args.tqdm == "on" or (args.tqdm == "auto" and sys.stderr.isatty())
    if not use:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=start, desc=args.name, unit="step", dynamic_ncols=True)


def main(argv=None):
    t_start = time.time()
    args = parse(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = device == "cuda"
    if not cuda and not args.smoke:
        print("note: no GPU; a 50M model on the CPU (and the gproj_cuda emulator) would take "
              "days. Use --smoke, or --device cpu with a tiny --layers/--dim/--steps.")
        if args.device != "cpu":
            return 2
    if cuda and args.arm != "fp32" and not gproj_cuda.is_available():
        print(f"gproj_cuda kernels unavailable ({gproj_cuda.unavailable_reason()}): the {args.arm} "
              "arm cannot run on the GPU")
        return 2
    torch.set_float32_matmul_precision("highest")       # FP32 attention means FP32, not TF32
    if not cuda:
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    os.makedirs(args.workdir, exist_ok=True)
    os.makedirs(args.ckpt_dir or args.workdir, exist_ok=True)
    ckpt_path = os.path.join(args.ckpt_dir or args.workdir, args.name + ".ckpt.pt")
    t_stop = t_start + args.time_budget_s
    if args.deadline is not None:
        t_stop = min(t_stop, args.deadline)
    summary_path = os.path.join(args.workdir, args.name + ".summary.json")

    train, val, data_info = load_corpus(val_pct=args.val_pct)
    data = Data(train, val, args.seqlen, args.batch, args.seed, args.eval_batches, device,
                args.steps)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = GPT(args.layers, args.dim, args.heads, 256, args.seqlen, args.qkv_bias,
                    args.kbias_init, args.seed)
    nparams = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(param_groups(model, args), lr=args.lr, betas=(0.9, args.beta2),
                            eps=args.adam_eps, **({"fused": True} if cuda else {}))
    amp = lambda: torch.autocast(device_type=device, dtype=torch.bfloat16)   # noqa: E731
    scale = 1.0 / math.sqrt(args.dim // args.heads)

    start = 0
    resume_step = None
    if args.resume:
        if os.path.exists(ckpt_path):
            ck = torch.load(ckpt_path, map_location=device, weights_only=False)
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            start = resume_step = ck["step"]
            print(f"resumed from {ckpt_path} at step {start}", flush=True)
        else:
            print(f"--resume: no checkpoint at {ckpt_path}; starting from step 0", flush=True)
    logs = Logs(args.workdir, args.name, args.layers, resume_step)
    gpu = torch.cuda.get_device_name() if cuda else None
    meta = dict(run=args.name, arm=args.arm, stress=args.stress, params=nparams, device=device,
                gpu=gpu, torch=torch.__version__, commit=_commit(), data=data_info,
                batch=args.batch, cmd="python bench/pretrain.py " + " ".join(
                    argv if argv is not None else sys.argv[1:]),
                args={k: v for k, v in vars(args).items()})
    with open(os.path.join(args.workdir, args.name + ".meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{args.name}: {gpu or 'CPU'}, torch {torch.__version__}: GPT {args.layers}L "
          f"{args.dim}d {args.heads}h (head dim {args.dim // args.heads}), "
          f"{nparams / 1e6:.3g}M params, qkv bias {args.qkv_bias}, key bias init "
          f"{args.kbias_init:g} (LR x{args.kbias_lr_mult:g}); {args.steps} steps x "
          f"{args.batch}x{args.seqlen} tokens, lr {args.lr:g}, warm-up {args.warmup}; data "
          f"{data_info['files']} stdlib files, {data_info['train_bytes'] / 1e6:.1f}M train / "
          f"{data_info['val_bytes'] / 1e6:.2f}M val bytes, sha256 {data_info['sha256']}; "
          f"budget {t_stop - t_start:.0f} s", flush=True)

    def evaluate():
        model.eval()
        tot = 0.0
        with torch.no_grad(), amp():
            for x, y in data.val_batches:
                logits = model(x, args.arm)
                tot += float(F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1)))
        model.train()
        return tot / len(data.val_batches)

    def save_ckpt(step):
        tmp = ckpt_path + ".tmp"
        torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step), tmp)
        os.replace(tmp, ckpt_path)

    params = [p for p in model.parameters()]
    zero = lambda: torch.zeros((), device=device)   # noqa: E731
    acc_loss, acc_gn, acc_gmax, acc_n = zero(), zero(), zero(), 0
    t_loop, tok_t0, tok_s0 = time.time(), time.time(), start
    bar = _progress(args, start, args.steps)
    stop_reason, last_rec, step = "steps", None, start
    last_ckpt = start
    for s in range(start, args.steps):
        step = s + 1
        out_of_time = time.time() > t_stop
        is_eval = step % args.eval_every == 0 or s == 0 or step == args.steps
        is_log = (step % args.log_every == 0 or is_eval or s == start or out_of_time)
        lr = lr_at(s, args)
        for gr in opt.param_groups:
            gr["lr"] = lr * gr["lr_mult"]
        x, y = data.batch_at(s)
        taps = [Tap(args.diag_seqs) for _ in range(args.layers)] if is_log else None
        with amp():
            logits = model(x, args.arm, taps)
            loss = F.cross_entropy(logits.float().view(-1, 256), y.reshape(-1))
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, args.grad_clip if args.grad_clip > 0
                                            else math.inf)
        layers = None
        if is_log:   # before the update: the kbias_rms that went with this step's forward
            layers = []
            for i, blk in enumerate(model.blocks):
                try:
                    layers.append(dict(layer=i, **layer_stats(taps[i].t, scale, blk.attn.k_bias)))
                except Exception as e:            # a diagnostic must never kill the run
                    print(f"  diagnostics failed at layer {i}: {type(e).__name__}: {e}", flush=True)
                    layers.append(dict(layer=i, **{k: _NAN for k in LAYER_STATS}))
            del taps
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc_loss += loss.detach()
        acc_gn += gn.detach()
        acc_gmax = torch.maximum(acc_gmax, gn.detach())
        acc_n += 1
        if bar is not None:
            bar.update(1)
        if not is_log:
            continue
        now = time.time()
        rec = dict(run=args.name, arm=args.arm, stress=args.stress, step=step,
                   tokens=step * args.batch * args.seqlen, elapsed_s=round(now - t_start, 2),
                   tok_per_s=round((step - tok_s0) * args.batch * args.seqlen
                                   / max(1e-9, now - tok_t0)),
                   lr=lr, train_loss=float(acc_loss) / acc_n, train_loss_step=float(loss.detach()),
                   val_loss=evaluate() if is_eval or out_of_time else None,
                   grad_norm=float(acc_gn) / acc_n, grad_norm_step=float(gn),
                   grad_norm_max=float(acc_gmax), layers=layers)
        acc_loss, acc_gn, acc_gmax, acc_n = zero(), zero(), zero(), 0
        logs.write(rec)
        last_rec = rec
        mx = lambda key: _max(L[key] for L in layers)   # noqa: E731
        line = (f"step {step}/{args.steps} tok {rec['tokens'] / 1e6:.2f}M loss "
                f"{rec['train_loss']:.4f} val {_fmt(rec['val_loss'])} gnorm {rec['grad_norm']:.3g} "
                f"lr {lr:.3g} | max over layers: key_ratio {_fmt(mx('key_ratio'), '.3g')} "
                f"sumdk {_fmt(mx('sumdk'), '.2e')} (fp32 {_fmt(mx('sumdk_fp32'), '.2e')}) "
                f"dq_err {_fmt(100 * mx('dq_err'), '.3g')}% | {now - t_start:.0f} s, "
                f"{rec['tok_per_s']:,} tok/s")
        if bar is not None:
            bar.write(line)
        else:
            print(line, flush=True)
        tok_t0, tok_s0 = time.time(), step
        if s == start + 1 or (step == start + 2 * args.log_every):
            per = (time.time() - t_loop) / max(1, step - start)
            print(f"  ~{1e3 * per:.0f} ms/step incl. diagnostics: {args.steps} steps would take "
                  f"~{per * (args.steps - start) + (t_loop - t_start):.0f} s "
                  f"(budget {t_stop - t_start:.0f} s)", flush=True)
        if not all(math.isfinite(rec[k]) for k in ("train_loss", "grad_norm")):
            stop_reason = "non-finite loss or gradient norm"
            break
        if out_of_time:
            stop_reason = f"time budget ({t_stop - t_start:.0f} s)"
            break
        if args.ckpt_every and step - last_ckpt >= args.ckpt_every:
            save_ckpt(step)
            last_ckpt = step
    if bar is not None:
        bar.close()
    if args.ckpt_every and step != last_ckpt and not stop_reason.startswith("non-finite"):
        save_ckpt(step)
    summary = dict(meta, stop_reason=stop_reason, steps_done=step,
                   seconds=round(time.time() - t_start, 1),
                   final={k: _clean(last_rec[k]) if last_rec else None
                          for k in ("step", "train_loss", "val_loss", "grad_norm")},
                   final_layers=[{a: _clean(b) for a, b in L.items()}
                                 for L in (last_rec or {}).get("layers") or []])
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    print(f"{args.name}: stopped after step {step} ({stop_reason}), {time.time() - t_start:.1f} s; "
          f"wrote {logs.jsonl}, {logs.csv}, {summary_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
