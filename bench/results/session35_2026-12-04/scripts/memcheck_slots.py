# compute-sanitizer memcheck on the persistent forward over varlen slots (session 35): every head
# dim, both modes, no mask / causal / band, 40 sequences with empty ones, the default dispatch and
# the persistent variant 3 (d = 256's persistent kernel), the counter and the round robin.
import os, itertools, torch, gproj_cuda
torch.manual_seed(0)
dev = "cuda"
lens = [0, 1, 127, 128, 129, 0, 300, 1000] + [int(x) for x in torch.randint(0, 90, (32,))]
cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
def r(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16)
for d in (64, 128, 256):
    q, k, v = r(int(cu[-1]), 4, d), r(int(cu[-1]), 2, d), r(int(cu[-1]), 2, d)
    for env in ({}, {"GPROJ_FWD_VARIANT": "3"}, {"GPROJ_FWD_AB": "8"}):
        for name in ("GPROJ_FWD_VARIANT", "GPROJ_FWD_AB"): os.environ.pop(name, None)
        os.environ.update(env)
        for m in ("gproj", "fa3"):
            for w in ((-1, -1), (-1, 0), (100, 0)):
                o = gproj_cuda.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), window_size=w, numerics=m)
                torch.cuda.synchronize(); assert torch.isfinite(o).all()
print("memcheck_slots: ran every case")
