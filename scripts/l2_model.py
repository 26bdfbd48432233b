"""A model of what fa3 mode's KV-outer backward pass reads from memory beyond L2, by the order of
its work (no GPU): which (query head, query tile) slabs -- Q, dO and dq_accum, block_m x d x
(2 + 2 + 4) bytes; 64-row tiles at d = 128, 128-row at d = 64 -- the running blocks touch,
replayed through an LRU cache the size of L2.
Blocks go to whichever SM is free first in grid order (the hardware's dispatch, as
scripts/sched_model.py models it); an item (one query tile of one head) costs one time unit, a
block's fixed work `--overhead` units. Prints, per order, the slabs missed over the slabs touched
and the model's end time over the mean SM's.

Orders (csrc/backward/bwd_kv_common_sm90.cuh, KeyBlockWork; csrc/common/tile.cuh, tile_grid):
- head-major: a block walks its kv head's query heads one after another, each head's tiles in
  order (the default);
- tiles-outer: from the block's last query tile down, the query heads inner (variant 20);
- per-head: one block per query head and key block (variant 22: GPROJ_BWD_KV_SPLITS = group).
Grid: at most four waves of blocks, every pair's longest block first (rank-major); longer grids
by groups of pairs whose slabs fill half of L2, each group's longest first (N >= 4k), else pair
after pair.
Usage: python scripts/l2_model.py [--n 4096] [--tokens 16384] [--heads 16] [--heads-k 2] [--d 128]
       [--block-m 64 (128 at d = 64)] [--l2-mb 50] [--causal 1] [--sms 132] [--overhead 6]"""
import argparse
import collections
import heapq


def blocks_for(order, n, pairs, heads_k, group, tiles_q, key_blocks, causal, l2_slabs, sms,
               block_m=64):
    """The grid's blocks in dispatch order, each a list of (pair, head, tile) items."""
    def items(pair, n_block, heads):
        lo = n_block * 128 // block_m if causal else 0  # 128-key blocks
        tiles = list(range(lo, tiles_q))
        if order == "tiles-outer":
            return [(pair, h, t) for t in reversed(tiles) for h in heads]
        return [(pair, h, t) for h in heads for t in tiles]
    units = []  # (pair, share, heads)
    for pair in range(pairs):
        if order == "per-head":
            units += [(pair, h, [h]) for h in range(group)]
        else:
            units.append((pair, 0, list(range(group))))
    total = len(units) * key_blocks
    if causal and total <= 4 * sms:  # rank-major
        return [items(p, nb, hs) for nb in range(key_blocks) for p, _, hs in units]
    if causal and n >= 4096:  # groups of units whose slabs fill half of L2
        per_unit = tiles_q * len(units[0][2])
        g = max(1, min(len(units), (l2_slabs // 2) // per_unit))
        out, rest = [], len(units) % g or g
        groups = [units[:rest]] + [units[i:i + g] for i in range(rest, len(units), g)]
        for grp in groups:
            out += [items(p, nb, hs) for nb in range(key_blocks) for p, _, hs in grp]
        return out
    return [items(p, nb, hs) for p, _, hs in units for nb in range(key_blocks)]


def simulate(blocks, sms, overhead, l2_slabs):
    """Greedy dispatch; items replayed in time order through an LRU of l2_slabs slabs.
    Returns (misses, touches, end time, mean SM time)."""
    free = [(0.0, s) for s in range(sms)]
    events = []  # (time, seq, slab)
    seq, busy = 0, [0.0] * sms
    for blk in blocks:
        t, s = heapq.heappop(free)
        t += overhead
        for item in blk:
            events.append((t, seq, item))
            seq += 1
            t += 1.0
        busy[s] = t
        heapq.heappush(free, (t, s))
    events.sort()
    lru, misses = collections.OrderedDict(), 0
    for _, _, slab in events:
        if slab in lru:
            lru.move_to_end(slab)
        else:
            misses += 1
            lru[slab] = True
            if len(lru) > l2_slabs:
                lru.popitem(last=False)
    return misses, len(events), max(busy), sum(busy) / sms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-k", type=int, default=2)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--block-m", type=int, default=0, help="query tile rows (0: 128 at d = 64, else 64)")
    ap.add_argument("--l2-mb", type=float, default=50)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=6)
    a = ap.parse_args()
    batch = max(1, a.tokens // a.n)
    pairs, group = batch * a.heads_k, a.heads // a.heads_k
    bm = a.block_m or (128 if a.d == 64 else 64)
    slab_bytes = bm * a.d * (2 + 2 + 4)
    l2_slabs = int(a.l2_mb * 2**20 // slab_bytes)
    print(f"N = {a.n}, {batch} x {a.heads} heads ({a.heads_k} kv heads), d = {a.d}, "
          f"{'causal' if a.causal else 'no mask'}; L2 holds {l2_slabs} slabs of {slab_bytes >> 10} KB")
    print(f"{'order':>12} | {'blocks':>6} | {'slabs missed / touched':>22} | {'end / mean SM':>13}")
    for order in ("head-major", "tiles-outer", "per-head"):
        blocks = blocks_for(order, a.n, pairs, a.heads_k, group, a.n // bm, a.n // 128,
                            bool(a.causal), l2_slabs, a.sms, bm)
        miss, touch, end, mean = simulate(blocks, a.sms, a.overhead, l2_slabs)
        print(f"{order:>12} | {len(blocks):6d} | {miss:9d} / {touch:9d} {miss / touch:5.1%} | "
              f"{end / mean:13.3f}")


if __name__ == "__main__":
    main()
