"""The CPU models that predict a schedule's behaviour before GPU time is spent on it
(scripts/l2_model.py): checks of the model's own bookkeeping, no GPU."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import l2_model  # noqa: E402


def _run(order, causal, l2_slabs, n=1024, pairs=2, group=4):
    blocks = l2_model.blocks_for(order, n, pairs, pairs, group, n // 64, n // 128, causal,
                                 l2_slabs, sms=16)
    return blocks, l2_model.simulate(blocks, 16, 2.0, l2_slabs)


def test_l2_model_work_and_compulsory_misses():
    """Every order covers the same (pair, head, tile) items, each once per key block that sees
    it; with an L2 that holds every slab only the first touch of each slab misses, and a smaller
    L2 misses no less."""
    for causal in (True, False):
        want = None
        for order in ("head-major", "tiles-outer", "per-head"):
            blocks, (miss, touch, end, mean) = _run(order, causal, l2_slabs=10**6)
            items = sorted(i for b in blocks for i in b)
            assert want is None or items == want, order
            want = items
            assert miss == len(set(items)) == 2 * 4 * (1024 // 64), (order, miss)
            assert touch == len(items) and end >= mean > 0
            # one key block of 128 keys per (pair, n); causal: tiles from 2n on
            per_block = [len(b) for b in blocks]
            assert sum(per_block) == touch
    for order in ("head-major", "tiles-outer", "per-head"):
        _, (miss, touch, _, _) = _run(order, True, l2_slabs=4)
        assert touch >= miss >= 2 * 4 * (1024 // 64), order


def test_l2_model_orders_differ_under_a_causal_mask():
    """The model's point (bench/NOTES.md session 38): under a causal mask with GQA, head-major
    blocks drift apart across their kv head's query heads and miss more than tile-major ones or
    one block per query head, with L2 far smaller than the problem's slabs."""
    misses = {o: _run(o, True, l2_slabs=24, n=2048, pairs=2, group=8)[1][0]
              for o in ("head-major", "tiles-outer", "per-head")}
    assert misses["head-major"] > misses["tiles-outer"], misses
    assert misses["head-major"] > misses["per-head"], misses
