# compute-sanitizer memcheck on d = 256's forward since session 36 (variant 7: persistent, O staged in
# the V stages, no pingpong; variant 12: with pingpong): both modes, no mask / causal / band, a dense
# batch with several tiles per block and a varlen batch with empty sequences; fp32 output (direct
# stores) through forward_kernel too.
import os, itertools, torch, gproj_cuda
from gproj_cuda.ops import forward_cuda
torch.manual_seed(0)
dev = "cuda"
lens = [0, 1, 127, 128, 129, 0, 300, 1000] + [int(x) for x in torch.randint(0, 90, (32,))]
cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=dev)
def r(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16)
d = 256
qv, kv, vv = r(int(cu[-1]), 4, d), r(int(cu[-1]), 2, d), r(int(cu[-1]), 2, d)
q, k, v = r(2, 1100, 4, d), r(2, 1100, 2, d) + 1, r(2, 1100, 2, d)
for var in ("", "12"):
    os.environ["GPROJ_FWD_VARIANT"] = var
    for m in ("gproj", "fa3"):
        for w in ((-1, -1), (-1, 0), (100, 0)):
            o = gproj_cuda.attention_varlen(qv, kv, vv, cu, cu, max(lens), max(lens), window_size=w, numerics=m)
            o2 = gproj_cuda.attention(q, k, v, window_size=w, numerics=m)
            torch.cuda.synchronize(); assert torch.isfinite(o).all() and torch.isfinite(o2).all()
print("memcheck_d256: ran every case")
