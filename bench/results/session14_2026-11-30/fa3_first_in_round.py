import sys, os
sys.path.insert(0, "scripts")
import torch
from _timing import Case, timed, interleaved
from gproj_cuda.ops import forward_cuda
for a in ["128,v1024", "128,v1024,causal", "128,v4096", "256,v1024", "128,1024", "128,2048,causal"]:
    c = Case.parse(a)
    fa3 = c.fa3()
    args, wr = c.forward_args(), c.window_right
    ours = lambda: forward_cuda(*args, c.scale, -1, wr, "fa3")
    t_fa3 = timed(fa3, 30); t_ours = timed(ours, 30)
    t_fa3b = timed(fa3, 30)
    med = interleaved([("fa3", None, fa3), ("ours", None, ours)], "X", 15)
    print(f"{a:18s} alone: fa3 {t_fa3:.3f} / {t_fa3b:.3f}  ours {t_ours:.3f} | interleaved: fa3 {med['fa3']:.3f} ours {med['ours']:.3f}", flush=True)
