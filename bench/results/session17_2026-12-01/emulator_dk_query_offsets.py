"""CPU emulator: the one-part dK (A rounded once + projection, the Hopper backward's form) against
three parts, on queries N(0,1) + offset (session 17). Run twice, repo root:
PYTHONPATH=. python bench/results/session17_2026-12-01/emulator_dk_query_offsets.py
with the exact centering rule for the queries (offsets 4, 5, 6, 7, 8, 9, 11:
emulator_dk_query_offsets_exact_rule.txt) and with centering.query_shift (offsets 4, 6, 8, 9, 11,
as below: emulator_dk_query_offsets_query_rule.txt)."""
import torch, itertools
from gproj_cuda import reference
from gproj_cuda.metrics import row_rel_err
torch.set_num_threads(2)
worst = 0
for d, n, causal in ((128, 1000, False), (128, 1000, True), (64, 2048, False)):
    for off in (4, 6, 8, 9, 11):
        for seed in range(2):
            g = torch.Generator().manual_seed(seed * 100 + off)
            q = (torch.randn(1, n, 1, d, generator=g) + off).bfloat16()
            k, v, do = (torch.randn(1, n, 1, d, generator=g).bfloat16() for _ in range(3))
            ref = reference.attention_grads(q, k, v, do, causal=causal)[3]
            e1 = reference.emulate(q, k, v, do, fp32_grads=True, a_parts=1, causal=causal)[3]
            e3 = reference.emulate(q, k, v, do, fp32_grads=True, a_parts=3, causal=causal)[3]
            a, b = row_rel_err(e1, ref), row_rel_err(e3, ref)
            worst = max(worst, a)
            print(d, n, causal, off, seed, f"1 part {a:.3%} 3 parts {b:.3%} ratio {a/b:.2f}", flush=True)
print("worst", worst)
