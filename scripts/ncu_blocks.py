"""Where a kernel's instructions go, by basic block: reads the per-instruction CSV that
`ncu -i REPORT --page source --csv --print-source sass` writes (scripts/ncu_round.sh does),
cuts the SASS where the executed count changes (a run of equal counts is one basic block, or a
few that run equally often), and prints the blocks by executed warp instructions with their share
of the stall samples and their commonest opcodes; then every instruction with at least MIN
samples. Session 13 compared our forward with FlashAttention-3's this way (bench/NOTES.md).
Usage: python scripts/ncu_blocks.py FILE.sass.csv [top_blocks=25] [min_samples=250]"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    min_samples = int(sys.argv[3]) if len(sys.argv) > 3 else 250
    rows = list(csv.reader(open(path)))
    hdr, data = rows[1], [r for r in rows[2:] if len(r) >= len(rows[1])]
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    iex, ism = hdr.index("Instructions Executed"), hdr.index("Warp Stall Sampling (All Samples)")
    base = int(data[0][ia], 16)
    ins = [(int(r[ia], 16) - base, r[isrc].strip(), int(r[iex] or 0), int(r[ism] or 0))
           for r in data]
    total = sum(x[2] for x in ins) or 1
    total_samples = sum(x[3] for x in ins) or 1
    blocks = []
    for addr, src, ex, sm in ins:
        words = src.split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else
              words[0] if words else "?").split(".")[0]
        if blocks and blocks[-1]["ex"] == ex:
            b = blocks[-1]
            b["n"] += 1
            b["sm"] += sm
            b["end"] = addr
        else:
            b = {"start": addr, "end": addr, "ex": ex, "n": 1, "sm": sm,
                 "ops": collections.Counter()}
            blocks.append(b)
        b["ops"][op] += 1
    print(f"{path}: {total / 1e6:.2f} M warp instructions executed, {total_samples} samples")
    print(f"{'block':>17} {'instr':>5} {'runs':>8} {'instr%':>6} {'samples%':>8}  top opcodes")
    for b in sorted(blocks, key=lambda b: -b["ex"] * b["n"])[:top]:
        ops = ",".join(f"{k}{v}" for k, v in b["ops"].most_common(6))
        print(f"{b['start']:#07x}-{b['end']:#07x} {b['n']:5d} {b['ex']:8d} "
              f"{100 * b['ex'] * b['n'] / total:6.1f} {100 * b['sm'] / total_samples:8.1f}  {ops}")
    print(f"\ninstructions with at least {min_samples} samples:")
    for addr, src, ex, sm in ins:
        if sm >= min_samples:
            print(f"{addr:#07x} {sm:6d} {ex:8d}  {src[:80]}")


if __name__ == "__main__":
    main()
