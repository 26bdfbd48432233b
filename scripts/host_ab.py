"""Session 36's host-path changes (gproj_cuda/ops.py: the raw stream handle, the device check and
compute capability asked once per device, one environment lookup per call for the poison switch,
the contiguous fast path of _kernel_ready) against the forms before them, in one process:
"before" swaps the old forms back into the module (the poison lookup aside: two more
os.environ reads per call). Wall time per call of a problem too small to keep the GPU busy
(B = 1, N = 256, 2 heads, d = 128), both forms interleaved batch by batch, the median of 9 batches
of 200 calls. Run on a GPU: python scripts/host_ab.py"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gproj_cuda  # noqa: E402
from gproj_cuda import _ext, ops  # noqa: E402

NEW = {name: getattr(ops, name) for name in ("_stream", "_check_device", "_capability_major",
                                             "_kernel_ready")}


def _old_check_device(device):
    reason = _ext.unavailable_reason(device.index)
    if reason is not None:
        raise RuntimeError(f"gproj_cuda cannot run on {device}: {reason}")


def _old_kernel_ready(t):
    if t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1:
        return t
    return t.contiguous()


OLD = {"_stream": lambda device: torch.cuda.current_stream(device).cuda_stream,
       "_check_device": _old_check_device,
       "_capability_major": lambda index: torch.cuda.get_device_capability(index)[0],
       "_kernel_ready": _old_kernel_ready}


def use(forms):
    for name, fn in forms.items():
        setattr(ops, name, fn)


def per_call_us(fn, n=200):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    torch.manual_seed(0)
    B, N, H, d = 1, 256, 2, 128
    q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    do = torch.randn_like(q)

    def train(m):
        out = gproj_cuda.attention(qg, kg, vg, numerics=m)
        out.backward(do)

    cands = {}
    for m in ("fa3", "gproj"):
        cands[f"kernel path {m}"] = lambda m=m: ops.forward_cuda(q, k, v, None, None, N, N,
                                                                 d ** -0.5, -1, -1, m)
        cands[f"api {m}, no grad"] = lambda m=m: gproj_cuda.attention(q, k, v, numerics=m)
        cands[f"api {m}, forward + backward"] = lambda m=m: train(m)
    times = {(name, form): [] for name in cands for form in ("before", "after")}
    for name, fn in cands.items():  # warm-up, both forms
        for forms in (OLD, NEW):
            use(forms)
            for _ in range(20):
                fn()
    for _ in range(9):
        for name, fn in cands.items():
            for form, forms in (("before", OLD), ("after", NEW)):
                use(forms)
                times[(name, form)].append(per_call_us(fn))
    use(NEW)
    print(f"{'host path (B=1, N=256, d=128)':36} {'before':>9} {'after':>9}  (us per call, median of 9)")
    for name in cands:
        b, a = (sorted(times[(name, f)])[4] for f in ("before", "after"))
        print(f"{name:36} {b:9.1f} {a:9.1f}  {a / b - 1:+.1%}")


if __name__ == "__main__":
    main()
