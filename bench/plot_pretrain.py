"""Plots of bench/pretrain.py logs: one line per run (arm x stress), against the step.

    python bench/plot_pretrain.py runs/pretrain                    # every *.jsonl in the folder
    python bench/plot_pretrain.py a/fa3-none.jsonl b/gproj-none.jsonl --out-dir plots
    python bench/plot_pretrain.py --smoke-dir /tmp/pt_smoke        # the smoke logs, PNGs there

Writes, into --out-dir (default: the folder of the first log), PREFIX_loss.png (train loss solid,
validation loss dashed with markers), PREFIX_grad_norm.png (global gradient norm before
clipping, mean since the previous record), PREFIX_key_ratio.png (key mean/spread ratio),
PREFIX_sumdk.png (|sum_j dK_j| / sum_j ||dK_j|| of the arm's dK; dotted: the FP32 recomputation
on the same tensors; grey: the BF16 rounding floor), PREFIX_dq_err.png (median per-row relative
dQ error of the arm vs float64; dotted: FP32 recomputation) and PREFIX_all.png (the five panels
together). Per-layer statistics are reduced over layers with --layer (default max: the worst
layer at each step; mean, median, or a layer index; median is the robust choice when a few
layers' attention is saturated and their per-row errors are undefined, as in --stress all).
Colours: fa3 red, gproj blue, fp32 black; line style by stress preset.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys

ARM_COLOR = {"fa3": "tab:red", "gproj": "tab:blue", "fp32": "black"}
STRESS_STYLE = {"none": "-", "lr": "--", "context": "-.", "keybias": ":", "all": (0, (5, 1, 1, 1))}
PANELS = ("loss", "grad_norm", "key_ratio", "sumdk", "dq_err")


def read_log(path):
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        return None
    # a resumed run rewrites its log, but be safe: the last record of each step wins, in order
    by_step = {}
    for r in recs:
        by_step[r["step"]] = r
    recs = [by_step[s] for s in sorted(by_step)]
    name = recs[0].get("run") or os.path.splitext(os.path.basename(path))[0]
    return dict(name=name, arm=recs[0].get("arm"), stress=recs[0].get("stress", "none"),
                recs=recs, path=path)


def _num(x):
    return math.nan if x is None else float(x)


def layer_value(rec, key, how):
    vals = [_num(L.get(key)) for L in rec.get("layers") or []]
    if how not in ("max", "mean", "median"):
        i = int(how)
        return vals[i] if i < len(vals) else math.nan
    vals = [v for v in vals if not math.isnan(v)]
    if not vals:
        return math.nan
    if how == "median":
        vals = sorted(vals)
        n = len(vals)
        return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
    return max(vals) if how == "max" else sum(vals) / len(vals)


def _series(run, fn):
    xs, ys = [], []
    for r in run["recs"]:
        y = fn(r)
        if y is not None and not math.isnan(y):
            xs.append(r["step"])
            ys.append(y)
    return xs, ys


def _style(run):
    return dict(color=ARM_COLOR.get(run["arm"], None),
                linestyle=STRESS_STYLE.get(run["stress"], "-"))


def draw(ax, panel, runs, how):
    lay = (f" ({how} over layers)" if how in ("mean", "median") else f" (layer {how})")
    lay = " (max over layers)" if how == "max" else lay
    positive = True
    for run in runs:
        st = _style(run)
        if panel == "loss":
            xs, ys = _series(run, lambda r: _num(r.get("train_loss")))
            ax.plot(xs, ys, label=f"{run['name']} train", **st)
            xs, ys = _series(run, lambda r: _num(r.get("val_loss")))
            ax.plot(xs, ys, marker="o", ms=3, color=st["color"], linestyle="--", lw=0.8,
                    label=f"{run['name']} val")
            positive = False
        elif panel == "grad_norm":
            xs, ys = _series(run, lambda r: _num(r.get("grad_norm")))
            ax.plot(xs, ys, label=run["name"], **st)
        elif panel == "key_ratio":
            xs, ys = _series(run, lambda r: layer_value(r, "key_ratio", how))
            ax.plot(xs, ys, label=run["name"], **st)
        elif panel == "sumdk":
            xs, ys = _series(run, lambda r: layer_value(r, "sumdk", how))
            ax.plot(xs, ys, label=f"{run['name']} (arm's dK)", **st)
            xs, ys = _series(run, lambda r: layer_value(r, "sumdk_fp32", how))
            ax.plot(xs, ys, color=st["color"], linestyle=":", lw=0.8, alpha=0.7,
                    label=f"{run['name']} FP32 recomputation")
            xs, ys = _series(run, lambda r: layer_value(r, "sumdk_floor", how))
            ax.plot(xs, ys, color="grey", linestyle="-", lw=0.6, alpha=0.5,
                    label="BF16 rounding floor" if run is runs[0] else None)
        elif panel == "dq_err":
            xs, ys = _series(run, lambda r: 100 * layer_value(r, "dq_err", how))
            ax.plot(xs, ys, label=f"{run['name']} (arm's dQ)", **st)
            xs, ys = _series(run, lambda r: 100 * layer_value(r, "dq_err_fp32", how))
            ax.plot(xs, ys, color=st["color"], linestyle=":", lw=0.8, alpha=0.7,
                    label=f"{run['name']} FP32 recomputation")
    titles = dict(loss=("loss (nats/byte)", "train (solid) and validation (dashed) loss"),
                  grad_norm=("global gradient norm", "gradient norm before clipping"),
                  key_ratio=("||k mean|| / rms spread", "key mean/spread ratio" + lay),
                  sumdk=("|sum_j dK_j| / sum_j ||dK_j||", "keys' common gradient" + lay),
                  dq_err=("median per-row dQ error (%)", "dQ error vs float64" + lay))
    ylabel, title = titles[panel]
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step")
    if positive:
        has = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
        if has and max(has) / min(has) > 20:
            ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def plot(runs, out_dir, prefix="pretrain", how="max"):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise SystemExit(f"plot_pretrain.py needs matplotlib: pip install matplotlib ({e})")
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for panel in PANELS:
        fig = Figure(figsize=(7, 4.2))
        FigureCanvasAgg(fig)
        draw(fig.add_subplot(), panel, runs, how)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{prefix}_{panel}.png")
        fig.savefig(path, dpi=110)
        written.append(path)
    fig = Figure(figsize=(16, 9))
    FigureCanvasAgg(fig)
    for i, panel in enumerate(PANELS):
        draw(fig.add_subplot(2, 3, i + 1), panel, runs, how)
    ax = fig.add_subplot(2, 3, 6)
    ax.axis("off")
    lines = []
    for run in runs:
        last = run["recs"][-1]
        vals = [r.get("val_loss") for r in run["recs"] if r.get("val_loss") is not None]
        lines.append(f"{run['name']}: step {last['step']}, train {_num(last.get('train_loss')):.4f}"
                     f", val {vals[-1] if vals else math.nan:.4f}, gnorm "
                     f"{_num(last.get('grad_norm')):.3g}, dQ err "
                     f"{100 * layer_value(last, 'dq_err', how):.3g}%")
    ax.text(0, 1, "last record\n" + "\n".join(lines), va="top", fontsize=8, family="monospace",
            wrap=True)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{prefix}_all.png")
    fig.savefig(path, dpi=100)
    written.append(path)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("logs", nargs="*", help="NAME.jsonl files or folders holding them")
    ap.add_argument("--smoke-dir", help="a folder of logs (e.g. the smoke runs'); PNGs go there "
                                        "unless --out-dir")
    ap.add_argument("--out-dir", help="where the PNGs go (default: the first log's folder)")
    ap.add_argument("--prefix", default="pretrain")
    ap.add_argument("--layer", default="max",
                    help="max, mean, median or a layer index (default max)")
    args = ap.parse_args(argv)
    sources = list(args.logs) + ([args.smoke_dir] if args.smoke_dir else [])
    if not sources:
        ap.error("give log files or folders (or --smoke-dir)")
    if args.layer not in ("max", "mean", "median") and not args.layer.isdigit():
        ap.error("--layer must be max, mean, median or a layer index")
    paths = []
    for s in sources:
        paths += sorted(glob.glob(os.path.join(s, "*.jsonl"))) if os.path.isdir(s) else [s]
    runs = [r for r in map(read_log, paths) if r is not None]
    if not runs:
        print(f"no log records found in {sources}")
        return 1
    order = {"fa3": 0, "gproj": 1, "fp32": 2}
    runs.sort(key=lambda r: (r["stress"], order.get(r["arm"], 9), r["name"]))
    out_dir = args.out_dir or (args.smoke_dir if args.smoke_dir else
                               os.path.dirname(os.path.abspath(paths[0])))
    written = plot(runs, out_dir, args.prefix, args.layer)
    print(f"{len(runs)} runs ({', '.join(r['name'] for r in runs)}): wrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
