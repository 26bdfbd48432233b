"""Small shapes through every kernel, for compute-sanitizer (memcheck / racecheck)."""
import torch

import gproj_cuda

torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16):
    for d in (64, 128, 256):
        for numerics in ("gproj", "fa3"):
            for causal in (False, True):
                q = torch.randn(2, 77, 4, d, device="cuda", dtype=dtype, requires_grad=True)
                k = torch.randn(2, 45, 2, d, device="cuda", dtype=dtype, requires_grad=True)
                v = torch.randn(2, 45, 2, d, device="cuda", dtype=dtype, requires_grad=True)
                o = gproj_cuda.attention(q, k, v, causal=causal, numerics=numerics,
                                         window_size=(30, -1))
                o.backward(torch.randn_like(o))
cu = torch.tensor([0, 5, 5, 70], dtype=torch.int32, device="cuda")
q = torch.randn(70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
o = gproj_cuda.attention_varlen(q, q, q, cu, cu, 65, 65, causal=True)
o.backward(torch.randn_like(o))
torch.cuda.synchronize()
print("sanitize case done")
