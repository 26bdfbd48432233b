"""``python -m gproj_cuda`` (or ``gproj-cuda``): the numerics study.

    python -m gproj_cuda                     # quick study (N=512, d=64) on GPU if present, else CPU
    python -m gproj_cuda --seqlen 1024 --head-dim 128 --dtype fp16
    python -m gproj_cuda --json study.json   # also write the records

    python -m gproj_cuda audit SCRIPT.py     # "am I affected?": audit your model (diagnostics.py)
    python -m gproj_cuda audit --demo        # the same on a small GPT with offset keys
"""

from __future__ import annotations

import argparse
import sys

import torch


def _parser():
    ap = argparse.ArgumentParser(
        prog="python -m gproj_cuda",
        description="Numerics study: median per-row error of dQ/dK against float64 for FA3's "
                    "BF16 arithmetic, GProj and FP32 attention, over the SPEC.md stress grid "
                    "(key mean kmean, query mean qmean, query scale qscale, causal or not). "
                    "Runs the CPU emulation of the kernels' arithmetic everywhere and the CUDA "
                    "kernels too when a GPU and the compiled extension are present. Ends with a "
                    "one-line verdict.",
        epilog="Subcommand: 'python -m gproj_cuda audit SCRIPT.py | --demo' measures the leak "
               "on your own model's attention calls (see 'python -m gproj_cuda audit --help').")
    ap.add_argument("--seqlen", type=int, default=512, help="sequence length N (default 512)")
    ap.add_argument("--head-dim", type=int, default=64, choices=(64, 128, 256))
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: the kernels too if a usable GPU is present (default)")
    ap.add_argument("--quick", action="store_true",
                    help="a 6-point subset of the grid (a few seconds)")
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON records")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "audit":
        from .diagnostics import cli
        return cli(argv[1:])
    args = _parser().parse_args(argv)
    from . import _ext
    from .study import run_study, save_json

    device = args.device
    if device == "auto":
        device = "cuda" if _ext.is_available() else "cpu"
        if device == "cpu":
            print(f"(kernels not used: {_ext.unavailable_reason()}; running the CPU emulator)\n")
    elif device == "cuda" and not _ext.is_available():
        print(f"error: --device cuda: {_ext.unavailable_reason()}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, torch.get_num_threads()))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    grid = {}
    if args.quick:
        grid = dict(kmeans=(0, 1024), qmeans=(0,), qscales=(1, 16, 32), causals=(False,))
    points = run_study(seqlen=args.seqlen, head_dim=args.head_dim, heads=args.heads, dtype=dtype,
                       device=device, seed=args.seed, **grid)
    if args.json:
        gpu = torch.cuda.get_device_name() if device == "cuda" else None
        save_json(points, args.json, dtype=dtype, head_dim=args.head_dim, seqlen=args.seqlen,
                  gpu=gpu)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
