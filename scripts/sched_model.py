"""A model of the forward's tile schedules under a causal mask (no GPU): the work each SM gets when
the query tiles are handed out in a given order to whichever SM is free first (the persistent
forward's tile counter; the hardware's dispatch of one-tile blocks in blockIdx order), or dealt
round robin, or claimed by a block as it starts its current tile (--claim-ahead: the persistent
producer's claim before session 15's last change). A tile costs its key tiles plus `overhead`
(its fixed work, in key tiles). Prints the busiest SM's work over the mean: the makespan's loss to
imbalance.

Orders (csrc/forward/fwd_sm90.cuh decode_tile, csrc/common/tile.cuh tile_grid):
- groups: groups of G (sequence, head) pairs whose K and V fit in half of L2, each group's
  longest query tiles first across its pairs, group after group; "remainder last" is the
  persistent schedule until session 31 (the last group holds pairs mod G), "remainder first"
  since session 32 (and the one-tile grids' order beyond four waves since then);
- pair after pair: each pair's tiles longest first, pair after pair (the one-tile grids' order
  beyond four waves until session 31);
- global: every pair's longest tile first, then the next longest (G = all pairs).
Usage: python scripts/sched_model.py [--sms 132] [--l2-mb 50] [--heads 16] [--d 128]
       [--block-n 128] [--overhead 1.5] [--claim-ahead]
(d = 256's forward runs 80-key tiles from N = 2k: --d 256 --heads 8 --block-n 80.)"""
import argparse
import heapq


def tile_keys(m, block_m, block_n):
    """Key tiles of query tile m under a causal mask (square problem)."""
    return -(-(m + 1) * block_m // block_n)


def ordered_costs(group_sizes, num_m, block_m, block_n, overhead):
    """Tile costs in schedule order: group after group, each group's longest tiles first."""
    costs = []
    for g in group_sizes:
        for mi in range(num_m):
            costs += [tile_keys(num_m - 1 - mi, block_m, block_n) + overhead] * g
    return costs


def greedy_makespan(costs, sms, claim_ahead=False):
    """The last SM's finishing time when tiles are taken in order: by the SM that is free first,
    or (claim_ahead) by the block that starts a tile first, as its next."""
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
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--overhead", type=float, default=1.5)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--claim-ahead", action="store_true")
    a = ap.parse_args()
    print(f"{'N':>6} {'pairs':>5} {'G':>4} | {'round robin':>11} {'rem. last':>9} {'rem. first':>10} "
          f"{'pair/pair':>9} {'global':>7}")
    for n in (1024, 2048, 4096, 8192, 16384):
        pairs, num_m = a.heads * max(1, a.tokens // n), -(-n // a.block_m)
        G = max(1, min(pairs, int((a.l2_mb * 2**20 / 2) // (2 * n * a.d * 2))))
        rem = pairs - (pairs - 1) // G * G
        full = [G] * ((pairs - 1) // G)
        cost = lambda groups: ordered_costs(groups, num_m, a.block_m, a.block_n, a.overhead)
        last, first = cost(full + [rem]), cost([rem] + full)
        mean = sum(last) / a.sms
        static = [0.0] * a.sms
        for t, c in enumerate(last):
            static[t % a.sms] += c
        pair_after_pair = []
        for _ in range(pairs):
            pair_after_pair += cost([1])
        span = lambda costs: greedy_makespan(costs, a.sms, a.claim_ahead) / mean
        print(f"{n:6d} {pairs:5d} {G:4d} | {max(static) / mean:11.3f} {span(last):9.3f} "
              f"{span(first):10.3f} {span(pair_after_pair):9.3f} {span(cost([pairs])):7.3f}")


if __name__ == "__main__":
    main()
