"""Warp-stall samples of one or more Nsight Compute source exports (`ncu --page source --csv
--print-source sass`, as scripts/ncu_round.sh writes them), side by side: the share of every stall
reason, the share by opcode (with its top reasons), and the most sampled synchronization and GEMM
instructions. Usage: python scripts/ncu_stalls.py A.sass.csv [B.sass.csv ...] [--top 20]
    [--reason wait]   (--reason: also that reason's samples by full opcode, e.g. MUFU.EX2 against
    HGMMA.64x64x16.F32.BF16: how session 45 compared the d = 64 passes' "wait")

Reading it: a sample lands on the instruction the warp will issue next, so time spent waiting at
a `BAR.SYNC` shows up on the instruction after it (reason "barrier"), and the wait for an
mbarrier's phase on the branch that tests the try-wait's result (reason "long_sb"). Session 16
(bench/NOTES.md) read the forward's "K waits" that way: mostly the pingpong turn's bar.sync."""
import argparse
import collections
import csv

SYNC_OPS = ("BAR", "SYNCS", "WARPGROUP", "HGMMA", "BRA")


def load(path):
    rows = list(csv.reader(open(path, newline="")))
    hdr = next(r for r in rows if "Address" in r and "Source" in r)
    data = rows[rows.index(hdr) + 1:]
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    insts = []
    for r in data:
        if len(r) < len(hdr):
            continue
        src = r[col["Source"]].strip()
        words = src.split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else
              words[0] if words else "")
        stalls = {}
        for s in reasons:
            try:
                stalls[s[6:]] = float(r[col[s]] or 0)
            except ValueError:
                stalls[s[6:]] = 0.0
        insts.append((r[col["Address"]], src, op.split(".")[0], stalls))
    return insts


def summarize(path, top, reason=None):
    insts = load(path)
    total = sum(sum(st.values()) for *_, st in insts) or 1.0
    by_reason = collections.Counter()
    by_op = collections.defaultdict(collections.Counter)
    for _, _, op, st in insts:
        by_reason.update(st)
        by_op[op].update(st)
    print(f"== {path}: {int(total)} samples")
    print("  reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in
                                     by_reason.most_common(10)))
    print("  by opcode (share of samples: top reasons):")
    ops = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))
    for op, c in ops[:14]:
        t = sum(c.values())
        print(f"    {op:10s} {100 * t / total:5.1f}%: " +
              ", ".join(f"{k} {100 * v / total:.1f}" for k, v in c.most_common(3)))
    print(f"  top {top} synchronization / GEMM instructions:")
    ranked = sorted(((sum(st.values()), a, s, st) for a, s, op, st in insts
                     if op in SYNC_OPS), reverse=True)
    for t, a, s, st in ranked[:top]:
        print(f"    {100 * t / total:5.2f}% {a[-6:]} {s[:66]:66s} {max(st, key=st.get)}")
    if reason:
        full = collections.Counter()
        for _, s, _, st in insts:
            words = [w for w in s.split() if not w.startswith("@")]
            full[words[0] if words else ""] += st.get(reason, 0.0)
        n = sum(full.values())
        print(f"  '{reason}': {int(n)} samples ({100 * n / total:.1f}%), by opcode:")
        for op, v in full.most_common(12):
            print(f"    {op:34s} {int(v):8d}  {100 * v / total:5.2f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--reason", default=None, help="a stall reason, e.g. wait, mio, short_sb")
    a = ap.parse_args()
    for path in a.csv:
        summarize(path, a.top, a.reason)


if __name__ == "__main__":
    main()
