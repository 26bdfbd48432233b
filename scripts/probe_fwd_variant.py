"""Which forward shapes finish under a GPROJ_FWD_VARIANT (each case in a child process with a
timeout, so a hang is reported instead of stalling the run). Usage:
  python scripts/probe_fwd_variant.py VARIANT [timeout_s]"""
import os
import subprocess
import sys

CASE = """
import torch, gproj_cuda
B, H, N, d, causal = {B}, {H}, {N}, {d}, {causal}
q, k, v = (torch.randn(B, N, H, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o = gproj_cuda.attention(q, k, v, causal=causal)
torch.cuda.synchronize()
r = gproj_cuda.reference.attention(q[:1, :256].double().cpu(), k[:1].double().cpu(),
                                   v[:1].double().cpu(), causal=False) if not causal and N <= 4096 else None
err = (o[:1, :256].double().cpu() - r).abs().max().item() if r is not None else float("nan")
print("ok", err)
"""


def main():
    variant = sys.argv[1]
    limit = float(sys.argv[2]) if len(sys.argv) > 2 else 20
    env = dict(os.environ, GPROJ_FWD_VARIANT=variant)
    cases = [(1, 1, 128 * t, d, c) for d in (64, 256) for c in (False,) for t in (132, 133, 264)]
    cases += [(1, 2, 128 * 132, 64, False), (2, 1, 128 * 132, 64, False), (1, 1, 128 * 264, 64, True)]
    for B, H, N, d, causal in cases:
        src = CASE.format(B=B, H=H, N=N, d=d, causal=causal)
        try:
            r = subprocess.run([sys.executable, "-c", src], env=env, capture_output=True, text=True,
                               timeout=limit)
            res = (r.stdout.strip().splitlines() or ["rc %d: %s" % (r.returncode, r.stderr[-300:])])[-1]
        except subprocess.TimeoutExpired:
            res = "HANG (> %g s)" % limit
        print(f"variant {variant} B={B} H={H} N={N} d={d} causal={causal} tiles={B*H*N//128}: {res}",
              flush=True)


if __name__ == "__main__":
    main()
