"""Forward A/B with little noise: cuDNN and our forward variants (GPROJ_FWD_VARIANT, read at every
call) and numerics modes, interleaved call by call in one process, so clock and thermal drift hit
every candidate alike (separate bench/speed.py runs drift by +-5-10% per shape). Prints the median
time of each candidate and its ratio to cuDNN's.
Usage: python scripts/fwd_ab.py VARIANTS [d,N[,causal][,gqa] ...]   e.g.  0,2  128,2048 64,16384,causal
N = vM: varlen, mean length M (bench/speed.py's lengths); the ratios are then to FlashAttention-3's
forward where flash_attn_interface imports, else to the first variant in fa3 mode (shown as base);
dense shapes add FlashAttention-3's forward as a candidate where it imports.
AB_ENV=NAME makes VARIANTS values of that switch instead (e.g. AB_ENV=GPROJ_TILE_ORDER 0,2).
AB_LIB=PATH adds "fa3 lib" and "gproj lib": the same call through another build of the extension
(e.g. the previous commit's .so), interleaved with the others."""
import os
import sys

from _timing import Case, interleaved, with_library

from gproj_cuda.ops import forward_cuda


def main():
    variants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["0"]
    shapes = sys.argv[2:] or ["64,2048", "64,16384", "128,2048", "128,2048,causal", "128,16384",
                              "128,16384,causal", "256,2048", "256,16384"]
    reps = int(os.environ.get("AB_REPS", "25"))
    lib = with_library(os.environ["AB_LIB"]) if os.environ.get("AB_LIB") else None
    header = None
    for a in shapes:
        c = Case.parse(a, varlen=True)
        d, n, args, wr = c.d, c.n, c.forward_args(), c.window_right
        # The ratios' base: cuDNN (dense), FlashAttention-3 where importable (varlen), or the
        # first candidate
        fa3 = c.fa3()
        cands = [("cudnn", None, c.cudnn)] if c.cu is None else ([("fa3", None, fa3)] if fa3 else [])
        if c.cu is None and fa3:  # FlashAttention-3 itself beside us, where its wheel imports
            cands.append(("FA3", None, fa3))
        for m in ("fa3", "gproj"):
            for var in variants:
                cands.append((f"{m} v{var}", var, lambda m=m: forward_cuda(
                    *args, c.scale, -1, wr, m)))
            if lib:
                cands.append((f"{m} lib", variants[0], lib(lambda m=m: forward_cuda(
                    *args, c.scale, -1, wr, m))))
        med = interleaved(cands, os.environ.get("AB_ENV", "GPROJ_FWD_VARIANT"), reps)
        base_name = cands[0][0]  # (without a peer: the first variant, fa3 mode, is the base)
        base = med[base_name]
        shown = cands[1:]
        names = [name for name, _, _ in shown]
        if names != header:  # (a header line whenever the candidates change)
            header = names
            print(f"{'d':>4} {'N':>6} {'mask':>18} | {'base':>6} {'ms':>8} | " +
                  " ".join(f"{x:>14}" for x in names))
        print(f"{d:4d} {n:6d} {c.mask:>18} | {base_name:>6} {base:8.3f} | " +
              " ".join(f"{med[name]:7.3f} {base / med[name]:5.3f}x" for name, _, _ in shown),
              flush=True)


if __name__ == "__main__":
    main()
