"""Am I affected? Measure the BF16 attention-gradient leak on a model's own tensors.

Fused attention kernels with FlashAttention-3's arithmetic (FA2/FA3/cuDNN) round the score
gradient dS to BF16 before the dQ/dK GEMMs; the rows of the rounded dS no longer sum to zero and
the residual leaks ``r_i · mean(k)`` into dQ (SPEC.md section 2). How much depends on the keys'
mean/spread ratio and on attention sharpness, which are properties of *your* model at *your*
point of training, not of the kernel. So the only honest answer to "am I affected?" is to take
the q, k, v and dO your model actually produces and run the arithmetic on them:

* ``audit(model, batch)`` runs one forward + backward, captures q, k, v, dO at every attention
  call, and for each layer x head reports the key/query mean/spread ratios, sharpness, the BF16
  row-sum residual of dS, and the median dQ/dK error of FA3 arithmetic and of GProj against
  float64 (``reference.emulate`` / ``reference.attention_grads`` on a slice of rows).
* ``LeakMonitor`` logs the cheap forward-only precursors (ratios, sharpness) every K training
  steps to CSV / TensorBoard, so you see the leak coming before the loss does.
* ``python -m gproj_cuda audit SCRIPT.py`` / ``--demo``: the same from the command line.

Capture works by temporarily rebinding ``gproj_cuda.attention``, ``gproj_cuda.flash_attn_func``
and ``torch.nn.functional.scaled_dot_product_attention`` (and every other module-level name bound
to the same function objects, e.g. after ``from gproj_cuda import attention``) to wrappers that
call the original; the originals are restored in a ``finally``. Not seen: calls inside
``torch.compile``d graphs, functions stored on objects before the capture, varlen calls and SDPA
with an explicit ``attn_mask`` (recorded as skipped). See docs/diagnostics.md.
"""

from __future__ import annotations

import contextlib
import csv
import fnmatch
import json
import math
import os
import sys
import textwrap
import threading
import time
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from . import api, reference
from .masks import normalize_window, visible
from .metrics import row_rel_err

AFFECTED = 0.01   # BF16 rounding alone gives ~0.2-0.4% median dQ error; above 1% it is the leak
_P_CHUNK = 1 << 22  # float64 score elements per chunk in the softmax statistics
_NAN = float("nan")
MONITOR_COLUMNS = ("step", "layer", "head", "key_ratio", "query_ratio", "max_prob", "entropy")


# --------------------------------------------------------------------------------------------
# Capture: rebinding the attention entry points
# --------------------------------------------------------------------------------------------

@dataclass
class _Call:
    """One captured attention call, in (B, N, H, d) layout whatever the API's layout was."""
    index: int
    module: str
    api: str
    q: torch.Tensor = None
    k: torch.Tensor = None
    v: torch.Tensor = None
    out: torch.Tensor = None           # the output as returned (the dO hook goes on it)
    causal: bool = False
    window: tuple = (-1, -1)
    scale: float = None
    bhnd: bool = False                 # the API's layout was (B, H, N, d) (SDPA)
    note: str = ""
    unsupported: str = ""


def _bind(args, kwargs, names, defaults):
    """Arguments by name from positional ``names`` (SDPA is a builtin: no inspect.signature)."""
    got = dict(defaults)
    got.update(zip(names, args))
    got.update(kwargs)
    return got


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEF = dict(attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)
_ATTN_ARGS = ("q", "k", "v")
_ATTN_DEF = dict(causal=False, softmax_scale=None, window_size=(-1, -1))
_FA_ARGS = ("q", "k", "v", "softmax_scale", "causal", "qv", "q_descale", "k_descale", "v_descale",
            "window_size")


def _parse(kind, args, kwargs, out):
    """A ``_Call`` (without index/module) from one call's arguments and output."""
    first = out[0] if isinstance(out, (tuple, list)) else out
    if kind == "sdpa":
        a = _bind(args, kwargs, _SDPA_ARGS, _SDPA_DEF)
        q, k, v = a["query"], a["key"], a["value"]
        c = _Call(-1, "", "scaled_dot_product_attention", causal=bool(a["is_causal"]),
                  scale=a["scale"])
        if a["attn_mask"] is not None:
            c.unsupported = "explicit attn_mask"
        elif q.dim() != 4 or k.dim() != 4:
            c.unsupported = f"SDPA with {q.dim()}-d query (only (B, H, N, d) is analysed)"
        elif c.causal and q.shape[-2] != k.shape[-2]:
            c.unsupported = "SDPA is_causal with seqlen_q != seqlen_k (top-left aligned mask)"
        if not c.unsupported:
            c.q, c.k, c.v = (t.transpose(1, 2) for t in (q, k, v))
            c.out, c.bhnd = first, True
        if a["dropout_p"]:
            c.note = f"dropout_p={a['dropout_p']} ignored"
        return c
    a = _bind(args, kwargs, _ATTN_ARGS if kind == "attention" else _FA_ARGS, _ATTN_DEF)
    c = _Call(-1, "", "gproj_cuda." + kind, q=a["q"], k=a["k"], v=a["v"], out=first,
              causal=bool(a["causal"]), scale=a["softmax_scale"])
    c.window = normalize_window(c.causal, a["window_size"])
    return c


class _Capture:
    """Context manager: while active, ``on_call(_Call)`` sees every attention call of this thread.

    ``enabled`` can be switched off (the audit does, before its backward: gradient checkpointing
    re-runs forwards inside the backward and those must not count as new calls). A call made
    *inside* a captured call (``flash_attn_func`` calls ``attention``) is not captured again.
    """

    def __init__(self, model, on_call):
        self.model, self.on_call = model, on_call
        self.enabled, self.count = True, 0
        self._stack, self._depth, self._patched, self._hooks = [], 0, [], []
        self._thread = None

    def _wrap(self, orig, kind):
        def wrapper(*args, **kwargs):
            if (not self.enabled or self._depth or threading.get_ident() != self._thread):
                return orig(*args, **kwargs)
            self._depth += 1
            try:
                out = orig(*args, **kwargs)
            finally:
                self._depth -= 1
            call = _parse(kind, args, kwargs, out)
            call.index, self.count = self.count, self.count + 1
            call.module = self._stack[-1] if self._stack else "<root>"
            self.on_call(call)
            return out
        wrapper.__wrapped__ = orig
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        return wrapper

    def _push(self, name):
        def pre_hook(_module, _args):
            self._stack.append(name)     # returns None: the module's inputs are unchanged
        return pre_hook

    def _pop(self, _module, _args, _output):
        if self._stack:
            self._stack.pop()            # returns None: the module's output is unchanged

    def __enter__(self):
        self._thread = threading.get_ident()
        originals = {id(api.attention): (api.attention, "attention"),
                     id(api.flash_attn_func): (api.flash_attn_func, "flash_attn_func"),
                     id(torch.nn.functional.scaled_dot_product_attention):
                         (torch.nn.functional.scaled_dot_product_attention, "sdpa")}
        wrappers = {key: self._wrap(fn, kind) for key, (fn, kind) in originals.items()}
        try:
            # Every module-level name bound to an original: gproj_cuda.attention,
            # gproj_cuda.api.attention, torch.nn.functional.scaled_dot_product_attention, and a
            # user module's own ``from gproj_cuda import attention``.
            for mod in list(sys.modules.values()):
                if not isinstance(mod, types.ModuleType):
                    continue
                try:
                    items = list(vars(mod).items())
                except TypeError:
                    continue
                for name, val in items:
                    w = wrappers.get(id(val))
                    if w is not None and val is originals[id(val)][0]:
                        setattr(mod, name, w)
                        self._patched.append((mod, name, val))
            for name, m in self.model.named_modules():   # which module made the call
                self._hooks.append(m.register_forward_pre_hook(self._push(name or "<root>")))
                self._hooks.append(m.register_forward_hook(self._pop, always_call=True))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for mod, name, val in reversed(self._patched):
            setattr(mod, name, val)
        for h in self._hooks:
            h.remove()
        self._patched, self._hooks, self._stack = [], [], []
        return False


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

def _mean_spread_ratio(x: torch.Tensor) -> torch.Tensor:
    """(B, N, H, d) -> (H,): ||x̄|| / rms ||x_j - x̄||, x̄ the mean over positions; mean over B.

    This is the quantity the leak scales with: the leaked term is r_i·k̄ while dQ itself is built
    from the keys' spread k_j - k̄.
    """
    ratios = []
    for b in range(x.shape[0]):
        xb = x[b].double()
        mean = xb.mean(0)                                         # (H, d)
        spread = (xb - mean).square().sum(-1).mean(0).sqrt()      # (H,)
        r = mean.norm(dim=-1) / spread
        ratios.append(torch.where(spread > 0, r, torch.full_like(r, _NAN)))
    return torch.stack(ratios).mean(0).cpu()


def _softmax_stats(q, k, v, do, scale, left, right, round_dtype):
    """Per head of (B, R, H, d) queries against (B, N, H, d) keys (bottom-right aligned mask):
    mean max probability, mean entropy (nats) and, with ``do``, the median row-sum residual
    |Σ_j round(dS)_ij| / Σ_j |dS_ij| of the score gradient rounded to ``round_dtype``, all from
    float64 P and dP. Memory: one chunk of heads' R x N float64 matrices at a time."""
    B, R, H, _ = q.shape
    N = k.shape[1]
    keep = visible(R, N, left, right, q.device)
    has = keep.any(-1)                                            # rows that see a key
    maxp, ent, res = [[] for _ in range(H)], [[] for _ in range(H)], [[] for _ in range(H)]
    step = max(1, _P_CHUNK // max(1, R * N))
    for b in range(B):
        for h0 in range(0, H, step):
            hs = slice(h0, min(H, h0 + step))
            qh, kh = (t[b, :, hs].transpose(0, 1).double() for t in (q, k))
            s = (scale * qh @ kh.transpose(-1, -2)).masked_fill(~keep, -math.inf)
            p = torch.softmax(s, -1).nan_to_num(0.0)
            mp = p.amax(-1)
            en = -torch.special.xlogy(p, p).sum(-1)
            if do is not None:
                vh, doh = (t[b, :, hs].transpose(0, 1).double() for t in (v, do))
                dp = doh @ vh.transpose(-1, -2)
                ds = p * (dp - (p * dp).sum(-1, keepdim=True))
                den = ds.abs().sum(-1)
                rr = ds.to(round_dtype).double().sum(-1).abs() / den
                rr = torch.where(den > 0, rr, torch.full_like(rr, _NAN))
            for j in range(mp.shape[0]):
                maxp[h0 + j].append(mp[j][has])
                ent[h0 + j].append(en[j][has])
                if do is not None:
                    res[h0 + j].append(rr[j][has])

    def agg(lst, fn):
        t = torch.cat(lst) if lst else torch.empty(0)
        t = t[~torch.isnan(t)]
        return float(fn(t)) if t.numel() else _NAN
    return ([agg(x, torch.mean) for x in maxp], [agg(x, torch.mean) for x in ent],
            [agg(x, torch.median) for x in res] if do is not None else [_NAN] * H)


def _sample(call: _Call, do, max_rows, max_heads, max_seqs, device):
    """The slice that is analysed: the LAST ``max_rows`` query rows with every key (so the
    bottom-right aligned causal/window mask stays valid), the first ``max_seqs`` sequences and
    ``max_heads`` query heads spread evenly; each head gets its own copy of the kv head it reads
    (GQA), so every head is analysed as plain MHA."""
    q, k, v = call.q, call.k, call.v
    B, Nq, H, _ = q.shape
    Hk = k.shape[2]
    if H % Hk:
        raise ValueError(f"attention call {call.index}: heads {H} not a multiple of kv heads {Hk}")
    nb = B if max_seqs is None else min(B, max_seqs)
    R = min(Nq, max_rows)
    heads = list(range(H)) if max_heads is None or max_heads >= H else sorted(
        {round(i * (H - 1) / max(1, max_heads - 1)) for i in range(max_heads)})
    hi = torch.tensor(heads, device=q.device)
    kvi = hi // (H // Hk)
    dev = device or q.device
    qs, dos = (None if t is None else t[:nb, Nq - R:].index_select(2, hi).to(dev)
               for t in (q, do))
    ks, vs = (t[:nb].index_select(2, kvi).to(dev) for t in (k, v))
    return heads, kvi.tolist(), R, qs, ks, vs, dos


def _analyse_call(call, do, max_rows, max_heads, max_seqs, device):
    """The per-head records of one call; ``do`` None gives the forward-only statistics.

    Inputs are rounded to the dtype BF16 kernels would see (FP16 stays FP16, anything else
    becomes BF16); the float64 reference runs on the same rounded inputs, so the errors are the
    kernels' arithmetic alone."""
    H, Hk = call.q.shape[2], call.k.shape[2]
    key_ratio = _mean_spread_ratio(call.k)
    query_ratio = _mean_spread_ratio(call.q)
    heads, kv_heads, R, q, k, v, do = _sample(call, do, max_rows, max_heads, max_seqs, device)
    rd = q.dtype if q.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
    q, k, v = q.to(rd), k.to(rd), v.to(rd)
    do = do.to(rd) if do is not None else None
    scale = reference.default_scale(q.shape[-1], call.scale)
    left, right = call.window
    maxp, ent, res = _softmax_stats(q, k, v, do, scale, left, right, rd)
    nan = [_NAN] * len(heads)
    errs = dict(fa3=(nan, nan), gproj=(nan, nan))
    if do is not None:
        kw = dict(causal=False, softmax_scale=scale, window_size=(left, right))
        _, _, rdq, rdk, _ = reference.attention_grads(q, k, v, do, **kw)
        for mode in errs:
            _, _, dq, dk, _ = reference.emulate(q, k, v, do, numerics=mode, fp32_grads=True, **kw)
            errs[mode] = ([row_rel_err(dq[:, :, i], rdq[:, :, i]) for i in range(len(heads))],
                          [row_rel_err(dk[:, :, i], rdk[:, :, i]) for i in range(len(heads))])
    note = call.note if do is not None else "; ".join(
        filter(None, [call.note, "no gradient reached this call"]))
    return [dict(layer=call.index, call_index=call.index, module=call.module, api=call.api,
                 head=h, kv_head=kv_heads[i], seqlen_q=call.q.shape[1], seqlen_k=call.k.shape[1],
                 head_dim=q.shape[-1], dtype=str(call.q.dtype).replace("torch.", ""),
                 causal=call.causal, window=list(call.window), scale=scale, rows=R,
                 key_ratio=float(key_ratio[h // (H // Hk)]), query_ratio=float(query_ratio[h]),
                 max_prob=maxp[i], entropy=ent[i], rowsum_residual=res[i],
                 fa3_dq_err=errs["fa3"][0][i], gproj_dq_err=errs["gproj"][0][i],
                 fa3_dk_err=errs["fa3"][1][i], gproj_dk_err=errs["gproj"][1][i], note=note)
            for i, h in enumerate(heads)]


@contextlib.contextmanager
def _quiet_math(device):
    """The analysis runs in the dtypes it asks for: no autograd and no autocast (training code
    often audits under autocast; it would round the emulator's fp32 GEMM results to BF16). TF32
    is switched off too, as a precaution: today every emulator GEMM takes BF16-valued operands,
    which TF32 multiplies exactly (checked on an H200: same errors with and without)."""
    prec = torch.get_float32_matmul_precision()
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        with torch.no_grad(), torch.autocast(torch.device(device).type, enabled=False):
            yield
    finally:
        torch.set_float32_matmul_precision(prec)
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


# --------------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------------

def _pct(x):
    if x is None or math.isnan(x):
        return "-"
    return "inf/NaN" if math.isinf(x) else f"{100 * x:.3g}%"   # row_rel_err: inf = NaN output


def _num(x):
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}"


@dataclass
class AuditReport:
    """Result of ``audit``: ``rows`` (one dict per layer x head, keys as in docs/diagnostics.md),
    ``skipped`` (calls not analysed, with the reason) and ``meta``."""
    rows: list
    skipped: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def _measured(self):
        """Rows with errors (NaN = no dO reached the call; inf = the emulation produced NaN,
        as FA3 arithmetic does on huge logits, and counts as the worst error)."""
        return [r for r in self.rows if not math.isnan(r["fa3_dq_err"])]

    def table(self, limit=None) -> str:
        """Rows sorted by risk (FA3-arithmetic median dQ error, highest first) as text."""
        rows = sorted(self.rows, key=lambda r: math.inf if math.isnan(r["fa3_dq_err"])
                      else -r["fa3_dq_err"])[:limit]
        cols = ("layer", "module", "head", "key_ratio", "query_ratio", "max_prob", "entropy",
                "rowsum_res", "fa3 dQ", "gproj dQ", "fa3 dK", "gproj dK")
        lines = [[str(r["layer"]), r["module"][-24:], str(r["head"]), _num(r["key_ratio"]),
                  _num(r["query_ratio"]), _num(r["max_prob"]), _num(r["entropy"]),
                  _num(r["rowsum_residual"]), _pct(r["fa3_dq_err"]), _pct(r["gproj_dq_err"]),
                  _pct(r["fa3_dk_err"]), _pct(r["gproj_dk_err"])] for r in rows]
        w = [max(len(c), *(len(x[i]) for x in lines)) if lines else len(c)
             for i, c in enumerate(cols)]
        fmt = lambda xs: "  ".join(x.rjust(w[i]) if i != 1 else x.ljust(w[i])
                                   for i, x in enumerate(xs))
        out = [fmt(cols), "  ".join("-" * x for x in w)] + [fmt(x) for x in lines]
        for s in self.skipped:
            out.append(f"skipped: call {s['call_index']} ({s['module']}, {s['api']}): "
                       f"{s['reason']}")
        return "\n".join(out)

    def verdict(self) -> str:
        """One line: AFFECTED (worst FA3-arithmetic dQ error above 1%) or not affected."""
        m = self._measured()
        if not m:
            n = len({r["call_index"] for r in self.rows})
            return (f"no verdict: none of the {n} analysed attention calls received a gradient "
                    "(frozen model, loss detached from them, or reentrant checkpointing?)"
                    if self.rows else "no verdict: no attention call was captured (see "
                    "docs/diagnostics.md: compiled models, functions stored before the audit)")
        worst = max(m, key=lambda r: r["fa3_dq_err"])
        gp = max(r["gproj_dq_err"] for r in m)
        if worst["fa3_dq_err"] > AFFECTED:
            return (f"AFFECTED: FA3-arithmetic dQ error up to {_pct(worst['fa3_dq_err'])} "
                    f"(layer {worst['layer']} head {worst['head']}); GProj {_pct(gp)}")
        return (f"not affected (max FA3-arithmetic dQ error {_pct(worst['fa3_dq_err'])} < "
                f"{_pct(AFFECTED)})")

    def to_json(self, path):
        """Write {verdict, rows, skipped, meta}; NaN becomes null."""
        clean = lambda r: {k: (None if isinstance(x, float) and not math.isfinite(x) else x)
                           for k, x in r.items()}
        with open(path, "w") as f:
            json.dump(dict(verdict=self.verdict(), rows=[clean(r) for r in self.rows],
                           skipped=self.skipped, meta=self.meta), f, indent=1)

    def plot(self, path):
        """PNG: per layer, the max over heads of the FA3-arithmetic and GProj dQ error (log)."""
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
        except ImportError as e:
            raise RuntimeError("AuditReport.plot needs matplotlib: pip install matplotlib") from e
        from matplotlib.figure import Figure
        layers = sorted({r["call_index"] for r in self._measured()})
        fig = Figure(figsize=(max(6.5, 0.35 * len(layers) + 3), 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        names = {r["call_index"]: str(r["layer"]) for r in self.rows}
        for key, label, style in (("fa3_dq_err", "FA3 arithmetic", "o-"),
                                  ("gproj_dq_err", "GProj", "s-")):
            ys = [max(r[key] for r in self._measured() if r["call_index"] == L) for L in layers]
            ax.plot(range(len(layers)), [min(max(y, 1e-6), 100.0) for y in ys], style,
                    label=label)                      # inf (NaN output) drawn at 10000%
        ax.axhline(AFFECTED, color="grey", ls="--", lw=1, label="1% (affected above)")
        ax.set_yscale("log")
        ax.set_xticks(range(len(layers)), [names[L] for L in layers], rotation=45, ha="right")
        ax.set_xlabel("layer (attention call)")
        from matplotlib.ticker import PercentFormatter
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel("dQ error vs float64\n(median over rows, max over heads)")
        ax.set_title(textwrap.fill(self.verdict(), 90), fontsize=8)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=120)


def _call_model(model, batch):
    return model(**batch) if isinstance(batch, Mapping) else model(batch)


def _default_loss(output, batch):
    """output.loss if present, else the square mean of the (first) output tensor."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, Mapping):
        loss = output.get("loss")
        if loss is None:
            output = next((x for x in output.values() if isinstance(x, torch.Tensor)), output)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    if isinstance(output, torch.Tensor):
        return output.float().square().mean()
    raise TypeError(f"loss_fn: cannot derive a loss from a model output of type "
                    f"{type(output).__name__}; pass loss_fn=lambda output, batch: <scalar>")


def _layer_filter(layers):
    if layers is None:
        return None, False
    if isinstance(layers, (int, str)):
        layers = [layers]
    try:
        layers = list(layers)
    except TypeError:
        raise TypeError(f"layers must be None or a list of call indices (int) or module names "
                        f"(str, fnmatch patterns), got {type(layers).__name__}") from None
    if not all(isinstance(x, (int, str)) for x in layers):
        raise TypeError(f"layers must hold ints (call indices) or strs (module names), got "
                        f"{layers!r}")
    by_name = any(isinstance(x, str) for x in layers)
    return (lambda c: any(c.index == x if isinstance(x, int) else fnmatch.fnmatchcase(c.module, x)
                          for x in layers)), by_name


def _positive(name, x, allow_none=False):
    if x is None and allow_none:
        return
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name} must be a positive int{' or None' if allow_none else ''}, "
                         f"got {x!r}")


def audit(model, batch, loss_fn=None, layers=None, *, max_rows=256, max_heads=None, device=None,
          max_seqs=None, train=False) -> AuditReport:
    """Measure the BF16 attention-gradient leak in ``model`` on one ``batch``.

    Runs ONE forward (``model(**batch)`` for a Mapping, else ``model(batch)``) and one backward
    of ``loss_fn(output, batch)`` (default: ``output.loss`` if present, else
    ``output.float().square().mean()``), capturing q, k, v and dO at every attention call made
    through ``gproj_cuda.attention``, ``gproj_cuda.flash_attn_func`` or
    ``torch.nn.functional.scaled_dot_product_attention``. For each call and head it reports (see
    docs/diagnostics.md) the key/query mean/spread ratio, sharpness, the BF16 row-sum residual
    of dS, and the median per-row dQ/dK error of FA3 arithmetic and GProj against float64,
    whatever kernel the model itself used: the question is what BF16 kernels would do with these
    tensors. Captured FP32 tensors are rounded to BF16 first (FP16 ones are kept in FP16).

    Cost is bounded by analysing a slice: the last ``max_rows`` query rows with all their keys
    (keeps the bottom-right causal alignment valid), ``max_heads`` heads (spread evenly; None =
    all) and the first ``max_seqs`` sequences (None = all). dQ errors are exact for those rows;
    dK errors are measured on the keys' gradient *from those rows only*. The slice is analysed
    in each call's backward hook, so only one call's slice is alive at a time.

    The model is left as it was: the backward is ``torch.autograd.grad`` to the attention
    outputs (no parameter ``.grad`` is written; existing ones are restored regardless), buffers
    and per-module train/eval flags are restored, the RNG state is forked, no optimizer runs.
    ``train=False`` runs the forward in eval mode (no dropout); ``layers`` selects calls by
    index (int) or module name (str, fnmatch pattern: then rows are labelled by name);
    ``device`` moves the slices elsewhere for analysis (default: where they are).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable(output, batch) -> scalar or None, got "
                        f"{type(loss_fn).__name__}")
    _positive("max_rows", max_rows)
    _positive("max_heads", max_heads, allow_none=True)
    _positive("max_seqs", max_seqs, allow_none=True)
    select, by_name = _layer_filter(layers)
    loss_fn = loss_fn or _default_loss
    rows, skipped, pending, t0 = [], [], {}, time.time()

    def finish(call, do):
        """Analyse one call (in its backward hook, or after the backward without dO)."""
        with _quiet_math(device or call.q.device):
            recs = _analyse_call(call, do, max_rows, max_heads, max_seqs, device)
        call.q = call.k = call.v = call.out = None       # release the activations
        if by_name:
            for r in recs:
                r["layer"] = call.module
        rows.extend(recs)

    def on_call(call):
        if select is not None and not select(call):
            return
        if call.unsupported:
            skipped.append(dict(call_index=call.index, module=call.module, api=call.api,
                                reason=call.unsupported))
            return
        # Keep detached views only (no copies): autograd holds these tensors until this call's
        # backward anyway, and the hook below releases them right before that backward runs.
        call.q, call.k, call.v = call.q.detach(), call.k.detach(), call.v.detach()
        out = call.out
        if isinstance(out, torch.Tensor) and out.requires_grad:
            pending[call.index] = (call, out)

            def hook(grad, call=call):
                if pending.pop(call.index, None) is not None:
                    finish(call, grad.transpose(1, 2) if call.bhnd else grad)
            out.register_hook(hook)
        else:
            finish(call, None)

    modes = {m: m.training for m in model.modules()}
    grads = {p: p.grad for p in model.parameters()}
    bufs = [(m, n, b, b.clone()) for m in model.modules() for n, b in m._buffers.items()
            if b is not None]
    devs = [torch.cuda.current_device()] if torch.cuda.is_available() and \
        torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devs), torch.enable_grad():
            model.train(train)
            with _Capture(model, on_call) as cap:
                output = _call_model(model, batch)
                loss = loss_fn(output, batch)
                cap.enabled = False      # recomputed forwards (checkpointing) are not new calls
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise ValueError(f"loss_fn must return a scalar tensor, got "
                                     f"{type(loss).__name__} {getattr(loss, 'shape', '')}")
                outs = [o for _, o in pending.values()]
                if outs and loss.requires_grad:
                    torch.autograd.grad(loss, outs, allow_unused=True)
                del output, loss, outs
            for call, _ in list(pending.values()):   # not connected to the loss
                finish(call, None)
            pending.clear()
    finally:
        pending.clear()
        for m, t in modes.items():
            m.training = t
        for p, g in grads.items():
            p.grad = g
        with torch.no_grad():
            for m, n, b, saved in bufs:
                m._buffers[n] = b
                if b.shape == saved.shape and not torch.equal(b, saved):
                    b.copy_(saved)
    rows.sort(key=lambda r: (r["call_index"], r["head"]))
    meta = dict(max_rows=max_rows, max_heads=max_heads, max_seqs=max_seqs, train=train,
                calls=cap.count, analysed=len({r["call_index"] for r in rows}),
                seconds=round(time.time() - t0, 2))
    return AuditReport(rows, skipped, meta)


# --------------------------------------------------------------------------------------------
# Monitoring during training
# --------------------------------------------------------------------------------------------

class LeakMonitor:
    """Log the leak's precursors every ``every`` training steps, forward only.

    The leak needs two things that grow slowly during pretraining: keys with a large common
    component (key mean/spread ratio) and sharp attention. Both are visible in the forward pass
    alone, so the monitor costs nothing on other steps and one small float64 softmax per head
    (``max_rows`` rows) on capture steps. Use it like this::

        mon = LeakMonitor(model, every=100, csv_path="attn_leak.csv", tensorboard_dir="runs/x")
        for step, batch in enumerate(loader):
            with mon.maybe_capture(step):        # a no-op context unless step % every == 0
                loss = model(batch).loss         # your normal forward (grad enabled is fine)
            loss.backward(); opt.step(); opt.zero_grad()
        mon.close()

    or ``mon.step(batch, step)`` for an extra no-grad forward on capture steps. Rows appended to
    the CSV: step, layer (attention call index), head, key_ratio, query_ratio, max_prob, entropy;
    TensorBoard (if ``torch.utils.tensorboard`` imports) gets per layer the max over heads of
    each, under ``attn_leak/<stat>/layer<L>``. On diffuse attention FA3 arithmetic's median dQ
    error is roughly 0.15% x key_ratio (CPU emulator, toy model), more on sharp attention, so
    when key_ratio passes ~5 or max_prob climbs towards 1, run ``audit`` on a batch.
    Captures are not seen inside ``torch.compile``d graphs (see docs/diagnostics.md).
    """

    def __init__(self, model, every=100, csv_path="attn_leak.csv", tensorboard_dir=None, *,
                 max_rows=128, max_heads=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        _positive("every", every)
        _positive("max_rows", max_rows)
        _positive("max_heads", max_heads, allow_none=True)
        self.model, self.every, self.csv_path = model, every, csv_path
        self.tensorboard_dir, self.max_rows, self.max_heads = tensorboard_dir, max_rows, max_heads
        self.last_rows = []
        self._writer = None

    def maybe_capture(self, step):
        """A context manager: captures the attention calls of the forward inside it when
        ``step % every == 0`` (and writes them on exit), else does nothing."""
        if step % self.every:
            return contextlib.nullcontext()
        return self._capture(step)

    @contextlib.contextmanager
    def _capture(self, step):
        rows = []

        def on_call(call):
            if call.unsupported:
                return
            with _quiet_math(call.q.device):
                call.q, call.k, call.v = call.q.detach(), call.k.detach(), call.v.detach()
                rows.extend(_analyse_call(call, None, self.max_rows, self.max_heads, 1, None))
            call.q = call.k = call.v = call.out = None

        with _Capture(self.model, on_call):
            yield
        self.last_rows = [dict(step=step, **{c: r[c] for c in MONITOR_COLUMNS[1:]})
                          for r in rows]
        self._write(step)

    def step(self, batch, step):
        """On capture steps, run an extra no-grad forward of ``batch`` and log it; returns the
        logged rows (an empty list on other steps). The RNG state is left untouched."""
        if step % self.every:
            return []
        devs = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=devs), torch.no_grad(), self._capture(step):
            _call_model(self.model, batch)
        return self.last_rows

    def _write(self, step):
        if self.csv_path:
            new = not os.path.exists(self.csv_path) or os.path.getsize(self.csv_path) == 0
            with open(self.csv_path, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=MONITOR_COLUMNS)
                if new:
                    w.writeheader()
                w.writerows(self.last_rows)
        if self.tensorboard_dir and self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._writer = SummaryWriter(self.tensorboard_dir)
            except ImportError as e:
                warnings.warn(f"LeakMonitor: TensorBoard logging off ({e}); CSV only")
                self.tensorboard_dir = None
        if self._writer is not None:
            for L in sorted({r["layer"] for r in self.last_rows}):
                mine = [r for r in self.last_rows if r["layer"] == L]
                for c in MONITOR_COLUMNS[3:]:
                    vals = [r[c] for r in mine if math.isfinite(r[c])]
                    if vals:
                        self._writer.add_scalar(f"attn_leak/{c}/layer{L}", max(vals), step)
            self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# --------------------------------------------------------------------------------------------
# The demo model and the command line
# --------------------------------------------------------------------------------------------

class _DemoBlock(torch.nn.Module):
    """Pre-LN transformer block whose keys carry a learned common offset (``key_bias``): the
    state late pretraining drifts into, set here by hand so the audit has something to find."""

    def __init__(self, width, head_dim, key_offset, gen):
        super().__init__()
        self.h, self.d = width // head_dim, head_dim
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        signs = torch.randint(0, 2, (width,), generator=gen).float() * 2 - 1
        self.key_bias = torch.nn.Parameter(key_offset * signs)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.h * self.d).unbind(2)
        k = k + self.key_bias
        q, k, v = (t.reshape(b, n, self.h, self.d).to(torch.bfloat16) for t in (q, k, v))
        y = api.attention(q, k, v, causal=True)
        x = x + self.proj(y.to(x.dtype).reshape(b, n, -1))
        return x + self.mlp(self.ln2(x))


class DemoGPT(torch.nn.Module):
    """A small GPT (head_dim 64, as the kernels require) whose layer l's keys are offset by
    ``key_offset * l / (layers - 1)`` along a fixed ±1 direction: layer 0 is healthy, the last
    one is where a long pretraining run ends up."""

    def __init__(self, layers=4, width=256, head_dim=64, vocab=256, seqlen=256, key_offset=64.0,
                 seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Embedding(seqlen, width)
        self.blocks = torch.nn.ModuleList(
            _DemoBlock(width, head_dim, key_offset * i / max(1, layers - 1), gen)
            for i in range(layers))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def demo_build(*, layers=4, seqlen=256, batch=1, key_offset=64.0, width=256, seed=0,
               device=None):
    """(model, tokens, next-token cross-entropy loss_fn) for the ``--demo`` audit."""
    from ._ext import is_available
    device = device or ("cuda" if is_available() else "cpu")
    model = DemoGPT(layers, width, 64, 256, seqlen, key_offset, seed).to(device)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, 256, (batch, seqlen), generator=gen).to(device)

    def loss_fn(logits, idx):
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(),
                                                 idx[:, 1:].flatten())
    return model, tokens, loss_fn


def _load_script(path):
    import runpy
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SCRIPT: no such file: {path}")
    ns = runpy.run_path(path, run_name="__gproj_audit__")
    build = ns.get("build")
    if not callable(build):
        raise ValueError(f"SCRIPT {path} must define build() returning (model, batch) or "
                         f"(model, batch, loss_fn)")
    got = build()
    if not isinstance(got, (tuple, list)) or len(got) not in (2, 3):
        raise ValueError(f"SCRIPT {path}: build() must return (model, batch) or "
                         f"(model, batch, loss_fn), got {type(got).__name__}")
    return tuple(got) + (None,) * (3 - len(got))


def cli(argv=None, out=None):
    """``python -m gproj_cuda audit SCRIPT.py | --demo [options]``; returns the exit code."""
    import argparse
    out = out or sys.stdout
    ap = argparse.ArgumentParser(
        prog="python -m gproj_cuda audit",
        description="Am I affected? One forward+backward of your model, capturing q, k, v, dO "
                    "at every attention call (gproj_cuda.attention, flash_attn_func, "
                    "F.scaled_dot_product_attention), and the dQ/dK error FA3's BF16 arithmetic "
                    "and GProj would make on them, per layer and head. SCRIPT.py defines build() "
                    "returning (model, batch) or (model, batch, loss_fn).")
    ap.add_argument("script", nargs="?", help="a Python file defining build()")
    ap.add_argument("--demo", action="store_true",
                    help="audit a small GPT whose keys carry a common offset instead")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    ap.add_argument("--plot", metavar="PATH", help="write a PNG of per-layer dQ errors")
    ap.add_argument("--max-rows", type=int, default=256, help="query rows analysed per sequence")
    ap.add_argument("--max-heads", type=int, default=None, help="heads analysed per call")
    ap.add_argument("--max-seqs", type=int, default=None, help="sequences analysed per call")
    ap.add_argument("--device", default=None, help="where to analyse (default: the tensors')")
    ap.add_argument("--top", type=int, default=None, help="print only the N riskiest rows")
    g = ap.add_argument_group("--demo model")
    g.add_argument("--demo-layers", type=int, default=4)
    g.add_argument("--demo-width", type=int, default=256, help="multiple of 64 (head_dim 64)")
    g.add_argument("--demo-seqlen", type=int, default=256)
    g.add_argument("--demo-batch", type=int, default=1)
    g.add_argument("--demo-key-offset", type=float, default=64.0,
                   help="key offset of the last layer (layer l gets offset*l/(layers-1))")
    args = ap.parse_args(argv)
    if args.demo == bool(args.script):
        ap.error("give exactly one of SCRIPT.py or --demo")
    if args.demo:
        if args.demo_width % 64 or args.demo_width < 64:
            ap.error(f"--demo-width must be a positive multiple of 64, got {args.demo_width}")
        model, batch, loss_fn = demo_build(layers=args.demo_layers, seqlen=args.demo_seqlen,
                                           batch=args.demo_batch, width=args.demo_width,
                                           key_offset=args.demo_key_offset)
        what = (f"demo GPT: {args.demo_layers} layers, width {args.demo_width} (head_dim 64), "
                f"seqlen {args.demo_seqlen}, last-layer key offset {args.demo_key_offset:g}")
    else:
        model, batch, loss_fn = _load_script(args.script)
        what = args.script
    rep = audit(model, batch, loss_fn, max_rows=args.max_rows, max_heads=args.max_heads,
                max_seqs=args.max_seqs, device=args.device)
    print(f"gproj_cuda audit of {what}: {rep.meta['calls']} attention calls, up to the last "
          f"{args.max_rows} query rows per sequence; median per-row error vs float64 "
          f"({rep.meta['seconds']:.1f} s)", file=out)
    print(rep.table(args.top), file=out)
    print(rep.verdict(), file=out)
    if args.json:
        rep.to_json(args.json)
        print(f"wrote {args.json}", file=out)
    if args.plot:
        rep.plot(args.plot)
        print(f"wrote {args.plot}", file=out)
    return 0
