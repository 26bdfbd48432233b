import sys, warnings, torch, time, statistics
sys.path.insert(0, "bench")
import speed, gproj_cuda, gproj_cuda.api as api, gproj_cuda.validation as val
torch.manual_seed(0)
H, d = 16, 128
def mk(mean):
    lens = speed.varlen_lengths(16384, mean)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    T = sum(lens)
    q, k, v = (torch.randn(T, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    return lens, cu, q, k, v
# 1. syncs
torch.cuda.set_sync_debug_mode("warn")
for mean in (1024,):
    lens, cu, q, k, v = mk(mean)
    for numerics in ("fa3", "gproj"):
        for causal in (False, True):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                o = gproj_cuda.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal, numerics=numerics)
                o.backward(torch.randn_like(o))
            import traceback
            print(f"[sync] varlen {numerics} causal={causal}: {len(w)} sync warnings")
            for x in w[:6]:
                print("   ", str(x.message)[:100], x.filename, x.lineno)
    # dense
    qd, kd, vd = (torch.randn(16, 1024, H, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    for numerics in ("fa3", "gproj"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o = gproj_cuda.attention(qd, kd, vd, causal=True, numerics=numerics)
            o.backward(torch.randn_like(o))
        print(f"[sync] dense {numerics}: {len(w)} sync warnings", [(x.filename, x.lineno) for x in w[:4]])
torch.cuda.set_sync_debug_mode(0)
# 2. timing with/without the value checks
orig = val.check_cu_seqlens
def nocheck(cu_q, cu_k, tq, tk, mq, mk_, dev):
    return None
rows = []
for mean in (1024, 4096):
    lens, cu, q, k, v = mk(mean)
    mx = max(lens)
    for numerics in ("fa3", "gproj"):
        for causal in (False, True):
            for check in ("check", "nocheck"):
                api.check_cu_seqlens = orig if check == "check" else nocheck
                with torch.no_grad():
                    f = lambda: gproj_cuda.attention_varlen(q, k, v, cu, cu, mx, mx, causal=causal, numerics=numerics)
                    ms = speed.time_cuda(f, budget_s=0.3)
                rows.append((mean, numerics, causal, check, ms))
                print(f"mean {mean} {numerics} causal={causal} {check}: fwd {ms:.3f} ms", flush=True)
api.check_cu_seqlens = orig
