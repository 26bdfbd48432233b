# compute-sanitizer memcheck on the shifted query tiles: dense and varlen causal, both modes.
import torch, gproj_cuda
torch.manual_seed(0)
dev = "cuda"
def r(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16)
for d, n in ((64, 1050), (128, 1050), (256, 1050), (256, 4100)):
    q, k, v = r(1, n, 2, d), r(1, n, 2, d), r(1, n, 2, d)
    for m in ("gproj", "fa3"):
        o = gproj_cuda.attention(q, k, v, causal=True, numerics=m)
        torch.cuda.synchronize(); assert torch.isfinite(o).all()
cu = torch.tensor([0, 700, 701, 4800], dtype=torch.int32, device=dev)
for d in (64, 128, 256):
    q, k, v = r(4800, 2, d), r(4800, 2, d), r(4800, 2, d)
    for m in ("gproj", "fa3"):
        o = gproj_cuda.attention_varlen(q, k, v, cu, cu, 4099, 4099, causal=True, numerics=m)
        torch.cuda.synchronize(); assert torch.isfinite(o).all()
print("memcheck_shift: ran every case")
