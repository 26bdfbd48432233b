"""A model of the persistent forward's tile schedule under a causal mask (no GPU): the work each
block gets when the query tiles of decode_tile's order (csrc/forward/fwd_sm90.cuh: groups of
(sequence, head) pairs whose K and V fit in half of L2, longest tile first inside a group) are
dealt round robin over the blocks, or handed out by a counter (each tile to the block that is free
first), or claimed by a block as it starts its current tile (--claim-ahead: the persistent
producer's claim before session 15's last change). A tile costs its key tiles plus `overhead`
(its fixed work, in key tiles). Prints the busiest block's work over the mean: the makespan's
loss to imbalance.
Usage: python scripts/sched_model.py [--sms 132] [--l2-mb 50] [--heads 16] [--d 128] [--claim-ahead]"""
import argparse
import heapq


def tile_costs(n, heads, d, l2_bytes, overhead, block_m=128, tokens=16384):
    batch = max(1, tokens // n)
    num_m, pairs = (n + block_m - 1) // block_m, heads * batch
    group = max(1, min(pairs, int((l2_bytes / 2) // (2 * n * d * 2))))
    costs = []
    for t in range(num_m * pairs):
        g, r = divmod(t, group * num_m)
        in_group = group if (g + 1) * group < pairs else pairs - (pairs - 1) // group * group
        mi = r // in_group
        costs.append((num_m - mi) + overhead)  # longest first: num_m - mi key tiles
    return group, costs


def counter_makespan(costs, sms, claim_ahead):
    """The last block's finishing time when tiles are taken in order from a counter: by the block
    that is free first, or (claim_ahead) by the block that starts a tile first, as its next."""
    if not claim_ahead:
        free = [(0.0, b) for b in range(sms)]
        for c in costs:
            f, b = heapq.heappop(free)
            heapq.heappush(free, (f + c, b))
        return max(f for f, _ in free)
    starts = [(0.0, b, b) for b in range(min(sms, len(costs)))]  # (start, block, tile)
    heapq.heapify(starts)
    nxt, end = len(starts), 0.0
    while starts:
        s, b, tile = heapq.heappop(starts)
        e = s + costs[tile]
        end = max(end, e)
        if nxt < len(costs):  # claimed now, started when this tile ends
            heapq.heappush(starts, (e, b, nxt))
            nxt += 1
    return end


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--l2-mb", type=float, default=50)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--overhead", type=float, default=1.5)
    ap.add_argument("--claim-ahead", action="store_true")
    a = ap.parse_args()
    print(f"{'N':>6} {'group':>5} {'round robin':>12} {'counter':>8}")
    for n in (1024, 2048, 4096, 8192, 16384):
        group, costs = tile_costs(n, a.heads, a.d, a.l2_mb * 2**20, a.overhead)
        mean = sum(costs) / a.sms
        static = [0.0] * a.sms
        for t, c in enumerate(costs):
            static[t % a.sms] += c
        dyn = counter_makespan(costs, a.sms, a.claim_ahead)
        print(f"{n:6d} {group:5d} {max(static) / mean:12.3f} {dyn / mean:8.3f}")


if __name__ == "__main__":
    main()
