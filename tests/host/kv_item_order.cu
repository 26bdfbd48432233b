// Host-side check of the KV-outer passes' item order (csrc/backward/bwd_kv_common_sm90.cuh), built
// and run by tests/test_host_layout.py with nvcc, no GPU needed. A block's producer thread and
// dQ writer warp take item it's (head, query tile) from KeyBlockWork::head / tile, its consumers
// from an ItemCursor stepped once per item: the two must agree item by item, or the consumers
// would compute with rows of another tile than the one loaded (and wait on the wrong stages).
// Checked for both orders (head-major, also rotated: each head's tiles from mb_min + rot on,
// cyclically, variant 33; tile-major from the last tile down with the heads inner) over blocks of
// 1-8 heads at any first head and 1-40 tiles from any first tile; and that each order visits
// every (head, tile) of the block exactly once, a head's tiles together.
#include <cstdio>
#include <vector>

#include "../../csrc/backward/bwd_kv_common_sm90.cuh"
#include "host_check.h"

int main() {
  using gproj::sm90::ItemCursor;
  using gproj::sm90::KeyBlockWork;
  int blocks = 0;
  for (int outer = 0; outer < 3; ++outer)  // 0 head-major, 1 tile-major, 2 head-major rotated
    for (int heads = 1; heads <= 8; ++heads)
      for (int head0 : {0, 3, 16})
        for (int mb_min : {0, 1, 7})
          for (int tiles = 1; tiles <= 40; ++tiles)
            for (int rot : {0, 1, tiles / 2, tiles - 1}) {
              if ((outer != 2 && rot != 0) || rot >= tiles) continue;
              const KeyBlockWork w(head0, heads, mb_min, mb_min + tiles, outer == 1, rot);
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
                if (outer != 1) {  // a head's tiles together, from mb_min + rot on, cyclically
                  CHECK(w.head(it) == head0 + it / tiles, "item %d: head %d\n", it, w.head(it));
                  CHECK(w.tile(it) == mb_min + (it % tiles + rot) % tiles, "item %d: tile %d\n",
                        it, w.tile(it));
                }
                cur = outer == 2 ? cur.next<true>(w) : cur.next(w);  // (kRotated's step)
              }
              for (int i = 0; i < heads * tiles; ++i)
                CHECK(seen[i] == 1, "order %d: (head %d, tile %d) visited %d times\n", outer,
                      head0 + i / tiles, mb_min + i % tiles, seen[i]);
              ++blocks;
            }
  std::printf("%d blocks\n", blocks);
  return report();
}
