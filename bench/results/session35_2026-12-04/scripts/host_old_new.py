# gproj's forward host path, session 35's one-params form (ops.forward_cuda) against the form
# before (two params sets, separate flags: inlined here), interleaved; outputs bitwise equal.
import sys, torch
sys.path.insert(0, "scripts")
from host_cost import per_call_us
from gproj_cuda import ops
def old(q, k, v, n, scale):
    flags = torch.empty(ops._k_shift_shape(k, None)[:2], dtype=torch.int32, device=k.device)
    kc, shift, counter = ops.center_keys_cuda(k, None, n, flags=flags, counter=True)
    return ops.forward_kernel(q, k, v, None, None, n, n, scale, -1, -1, "gproj", k_shift=shift,
                              k_centered=kc, center_flags=flags, zeroed_counter=counter)
for n, kmean in ((256, 0.0), (256, 40.0), (2048, 0.0)):
    q, k, v = (torch.randn(1 if n == 256 else 8, n, 2 if n == 256 else 16, 128, device="cuda") for _ in range(3))
    k = k + kmean
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    s = 128 ** -0.5
    a = ops.forward_cuda(q, k, v, None, None, n, n, s, -1, -1, "gproj")
    b = old(q, k, v, n, s)
    same = all(torch.equal(x, y) for x, y in zip(a, b))
    t = {"new": [], "old": []}
    for _ in range(9):
        t["new"].append(per_call_us(lambda: ops.forward_cuda(q, k, v, None, None, n, n, s, -1, -1, "gproj"), 200)[1])
        t["old"].append(per_call_us(lambda: old(q, k, v, n, s), 200)[1])
    print(f"N={n} kmean={kmean}: bitwise equal {same}; wall us/call new {sorted(t['new'])[4]:.1f} old {sorted(t['old'])[4]:.1f}", flush=True)
