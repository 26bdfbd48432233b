"""Where a kernel's warps wait, by code region: reads the per-instruction CSV that
`ncu -i REPORT --page source --csv --print-source sass` writes (scripts/ncu_round.sh does) and
prints the stall-reason totals, then the SASS cut at every GEMM issue/wait, barrier, mbarrier
wait and bulk copy, with each region's share of the warp-state samples and its top two stall
reasons. Usage: python scripts/ncu_regions.py FILE.sass.csv [min_share_percent]"""
import collections
import csv
import sys

CUTS = ("BAR.SYNC", "DEPBAR", "WARPGROUP.ARRIVE", "TRYWAIT", "UBLKRED", "LDGDEPBAR", "STSM")


def main():
    path = sys.argv[1]
    floor = float(sys.argv[2]) / 100 if len(sys.argv) > 2 else 0.01
    rows = list(csv.reader(open(path)))
    hdr = rows[1]
    data = [r for r in rows[2:] if len(r) >= len(hdr)]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    total = sum(samples(r) for r in data) or 1
    tot = collections.Counter()
    for r in data:
        for c in stalls:
            tot[c] += int(r[ix[c]] or 0)
    n = sum(tot.values()) or 1
    print(f"{rows[0][1][:100]}\n{total} samples; stall reasons: " +
          ", ".join(f"{k[6:]} {v / n * 100:.1f}%" for k, v in tot.most_common(8)))
    cuts = [i for i, r in enumerate(data) if any(c in r[ix["Source"]] for c in CUTS)]
    prev = 0
    for cut in cuts + [len(data)]:
        seg = data[prev:cut]
        share = sum(samples(r) for r in seg) / total
        if seg and share >= floor:
            st = collections.Counter()
            for r in seg:
                for c in stalls:
                    st[c] += int(r[ix[c]] or 0)
            s = sum(st.values()) or 1
            top = ", ".join(f"{k[6:]} {v / s * 100:.0f}%" for k, v in st.most_common(2))
            print(f"{prev:5d}-{cut:5d} ({cut - prev:4d} instr) {share * 100:5.1f}%  "
                  f"executed {seg[0][ix['Instructions Executed']]:>9s}  "
                  f"{seg[0][ix['Source']].strip()[:48]:48s}  [{top}]")
        prev = cut


if __name__ == "__main__":
    main()
