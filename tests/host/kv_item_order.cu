// Host-side check of the KV-outer passes' item order (csrc/backward/bwd_kv_common_sm90.cuh), built
// and run by tests/test_host_layout.py with nvcc, no GPU needed. A block's producer thread and
// dQ writer warp take item it's (head, query tile) from KeyBlockWork::head / tile, its consumers
// from an ItemCursor stepped once per item: the two must agree item by item, or the consumers
// would compute with rows of another tile than the one loaded (and wait on the wrong stages).
// Checked for both orders (head-major; tile-major from the last tile down with the heads inner)
// over blocks of 1-8 heads at any first head and 1-40 tiles from any first tile; and that each
// order visits every (head, tile) of the block exactly once.
#include <cstdio>
#include <vector>

#include "../../csrc/backward/bwd_kv_common_sm90.cuh"
#include "host_check.h"

int main() {
  using gproj::sm90::ItemCursor;
  using gproj::sm90::KeyBlockWork;
  int blocks = 0;
  for (int outer = 0; outer < 2; ++outer)
    for (int heads = 1; heads <= 8; ++heads)
      for (int head0 : {0, 3, 16})
        for (int mb_min : {0, 1, 7})
          for (int tiles = 1; tiles <= 40; ++tiles) {
            const KeyBlockWork w(head0, heads, mb_min, mb_min + tiles, outer == 1);
            CHECK(w.n_items == heads * tiles, "n_items %d for %d x %d\n", w.n_items, heads, tiles);
            std::vector<int> seen(heads * tiles, 0);
            ItemCursor cur(w);
            for (int it = 0; it < w.n_items; ++it) {
              CHECK(cur.h == w.head(it) && cur.mb == w.tile(it),
                    "order %d, %d heads from %d, tiles [%d, %d): item %d cursor (%d, %d), "
                    "head / tile (%d, %d)\n",
                    outer, heads, head0, mb_min, mb_min + tiles, it, cur.h, cur.mb, w.head(it),
                    w.tile(it));
              const int hh = w.head(it) - head0, tt = w.tile(it) - mb_min;
              CHECK(hh >= 0 && hh < heads && tt >= 0 && tt < tiles, "item %d out of range\n", it);
              if (hh >= 0 && hh < heads && tt >= 0 && tt < tiles) ++seen[hh * tiles + tt];
              if (outer == 1)  // from the last tile down, all heads of a tile together
                CHECK(w.tile(it) == mb_min + tiles - 1 - it / heads, "item %d: tile %d\n", it,
                      w.tile(it));
              cur = cur.next(w);
            }
            for (int i = 0; i < heads * tiles; ++i)
              CHECK(seen[i] == 1, "order %d: (head %d, tile %d) visited %d times\n", outer,
                    head0 + i / tiles, mb_min + i % tiles, seen[i]);
            ++blocks;
          }
  if (failures) {
    std::printf("%d checks failed\n", failures);
    return 1;
  }
  std::printf("%d blocks: all checks passed\n", blocks);
  return 0;
}
