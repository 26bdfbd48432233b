# Why gproj's forward time differs between rounds of bench/speed.py at short shapes (session 35):
# speed.py's own bench_one, impl after impl, 4 rounds; around every timed op the allocator's
# cudaMalloc / cudaFree counts and the host time per call.
import sys, time, torch
sys.path.insert(0, "bench")
import speed
speed.WARM_S, speed.BUDGET_S = 0.3, 0.2
orig = speed.time_cuda
log = []
def wrapped(fn, **kw):
    s0 = torch.cuda.memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        fn()
    host = (time.perf_counter() - t0) / 20 * 1e6
    torch.cuda.synchronize()
    ms = orig(fn, **kw)
    s1 = torch.cuda.memory_stats()
    log.append((ms, host, s1["num_device_alloc"] - s0["num_device_alloc"],
                s1["num_device_free"] - s0["num_device_free"], s1["reserved_bytes.all.current"] >> 20))
    return ms
speed.time_cuda = wrapped
impls = speed.available_impls()
names = ["gproj_cuda/gproj", "gproj_cuda/fa3", "sdpa_cudnn", "fa3"]
for shape in [(128, 2048, True, 1, "dense", None), (256, 1024, False, 1, "dense", None),
              (256, 2048, True, 1, "dense", None)]:
    for r in range(4):
        for nm in names:
            log.clear()
            ops = ["fwd"] if nm == "fa3" else ["fwd", "bwd"]
            speed.bench_one(impls[nm][0], shape, ops)
            ms, host, na, nf, res = log[0]
            print(f"d={shape[0]} N={shape[1]} causal={shape[2]} round {r} {nm:18s} fwd {ms:.3f} ms host {host:6.1f} us/call "
                  f"cudaMalloc {na} cudaFree {nf} reserved {res} MB", flush=True)
