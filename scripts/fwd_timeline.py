"""The GPU timeline of one forward call per numerics mode: every GPU operation (kernels, memsets)
with its start relative to the call's first operation, its duration and the idle gap before it,
so that the fixed costs between the centering pre-pass's kernels and the main kernel show.
The calls are queued back to back (the host stays ahead), and the call shown is the one with the
median span among `reps`. bf16, B*N = 16k tokens, H*d = 2048 (the bench shapes).
Usage: python scripts/fwd_timeline.py [d,N[,causal] ...]   (default: 128,2048,causal; N = vM:
varlen of mean length M, bench/speed.py's lengths)
GPROJ_FWD_AB is read at every call (e.g. GPROJ_FWD_AB=128: no programmatic launches)."""
import sys

import torch
from _timing import Case
from torch.profiler import ProfilerActivity, profile

from gproj_cuda.ops import forward_cuda


def short(name, width=60):
    name = name.replace("gproj::", "").replace("sm90::", "").replace("void ", "")
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    reps = 21
    for a in sys.argv[1:] or ["128,2048,causal"]:
        c = Case.parse(a, varlen=True)
        for mode in ("fa3", "gproj"):
            def call():
                forward_cuda(*c.forward_args(), c.scale, -1, c.window_right, mode)
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            # (CUDA activity only: record_function ranges would show up as GPU annotation events
            # spanning whole calls and break the split into calls below)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda._sleep(2_000_000)  # the host gets ahead of the GPU
                for _ in range(reps):
                    call()
                torch.cuda.synchronize()
            gpu = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                          and "sleep" not in e.name),
                         key=lambda e: e.time_range.start)
            # split into calls: each call starts with its first op after the previous call's main
            # kernel (the forward kernel is each call's last op)
            calls, cur = [], []
            for e in gpu:
                cur.append(e)
                if "fwd_" in e.name and "kernel" in e.name:
                    calls.append(cur)
                    cur = []
            spans = sorted(calls, key=lambda ops: ops[-1].time_range.end - ops[0].time_range.start)
            ops = spans[len(spans) // 2]
            prev_end = None
            # the gap before the first op: from the previous call's end (back to back)
            idx = calls.index(ops)
            if idx > 0:
                prev_end = calls[idx - 1][-1].time_range.end
            t0 = ops[0].time_range.start
            print(f"== d={c.d} N={c.n} {c.mask} mode={mode}: one call (median span of {len(calls)}), us")
            print(f"{'start':>8} {'dur':>8} {'gap':>7}  op")
            for e in ops:
                gap = "" if prev_end is None else f"{e.time_range.start - prev_end:7.1f}"
                print(f"{e.time_range.start - t0:8.1f} {e.time_range.end - e.time_range.start:8.1f} "
                      f"{gap:>7}  {short(e.name)}")
                prev_end = e.time_range.end
            span = ops[-1].time_range.end - ops[0].time_range.start
            main_k = ops[-1].time_range.end - ops[-1].time_range.start
            print(f"   span {span:.1f} us, main kernel {main_k:.1f} us, before it {span - main_k:.1f} us\n")


if __name__ == "__main__":
    main()
