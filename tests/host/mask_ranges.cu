// Host-side check of the KV-outer passes' masked tiles (built and run by tests/test_host_layout.py
// with nvcc, no GPU needed). On a tile the mask cuts, a pass zeroes the scores the mask hides by
// per-row ranges (mask_row_ranges over Mask::row_queries where the tile's rows are keys, S^T of
// the 64 / 128-row pass; over Mask::row_columns where they are queries, the d = 256 pass's
// variant 34), choosing a form with one bound where the other cannot cut. Checked here, in each
// pass's own accumulator partition (every consumer thread of its TiledMmaSdP), for random masks
// (causal, windows on either or both sides, a shifted diagonal, ragged ends) and random tiles
// that the mask cuts, including tiles past the last query or key: each score is zeroed exactly
// where Mask::visible says it is hidden. The per-element visible() test is what these forms
// replace, so a range off by one row or column fails here.
#include <cstdint>
#include <cstdio>

#include "../../csrc/backward/bwd_kv_dkvt_sm90.cuh"
#include "../../csrc/backward/bwd_kv_sm90.cuh"
#include "host_check.h"

// (a mutation for checking this check: -DMUTATE_KEY_ROWS="|| true" drops the upper bound on tiles
// past the last query, -DMUTATE_QUERY_ROWS="|| true" the lower bound of a left window)
#ifndef MUTATE_KEY_ROWS
#define MUTATE_KEY_ROWS
#endif
#ifndef MUTATE_QUERY_ROWS
#define MUTATE_QUERY_ROWS
#endif

using namespace cute;
using gproj::Mask;
using gproj::sm90::acc_rowcol;
using gproj::sm90::mask_row_ranges;

struct Rng {  // splitmix64
  uint64_t s;
  int below(int n) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return int((z ^ (z >> 31)) % uint64_t(n));
  }
};

// One pass: kKeyRows, the tile's rows are keys (S^T; the pass masks by row_queries, and under a
// causal mask inside the sequence by the lower bound alone, as bwd_kv_sm90.cuh); else queries
// (row_columns; the upper bound alone without a left bound, as bwd_kv_dkvt_sm90.cuh).
template <class Traits, bool kKeyRows>
void check(const char* name, uint64_t seed, int trials) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  using ShapeS = std::conditional_t<kKeyRows, Shape<Int<kBlockN>, Int<kBlockM>>,
                                    Shape<Int<kBlockM>, Int<kBlockN>>>;
  typename Traits::TiledMmaSdP mma;
  Rng rng{seed};
  int tiles = 0, hidden = 0, shown = 0;
  for (int t = 0; t < trials; ++t) {
    const int nq = 1 + rng.below(700), nk = 1 + rng.below(700);
    const int kind = rng.below(5);  // causal, left window, right window, both, none
    const int left = kind == 1 || kind == 3 ? rng.below(300) : -1;
    const int right = kind == 0 ? 0 : kind == 2 || kind == 3 ? rng.below(300) : -1;
    const int shift = rng.below(3) == 0 ? rng.below(200) - 100 : 0;
    const Mask mask(nq, nk, left, right, shift);
    // a tile up to one past the last of either side; every other one on the diagonal (give or
    // take a block), where the passes' cut tiles are
    const int mb = rng.below((nq + kBlockM - 1) / kBlockM + 1);
    const int diag = (mb * kBlockM + mask.offset()) / kBlockN + rng.below(3) - 1;
    const int nb = t % 2 == 0 && diag >= 0 ? diag : rng.below((nk + kBlockN - 1) / kBlockN + 1);
    const int i0 = mb * kBlockM, n0 = nb * kBlockN;
    if (!mask.tile_partial(i0, i0 + kBlockM, n0, n0 + kBlockN)) continue;  // never masked
    ++tiles;
    for (int tid = 0; tid < Traits::kNumMmaThreads; ++tid) {
      auto thr = mma.get_thread_slice(tid);
      Tensor tScS = thr.partition_C(make_identity_tensor(ShapeS{}));
      Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
      Tensor frag = partition_fragment_C(mma, ShapeS{});
      Tensor s_rc = make_tensor(frag.data(), acc_rowcol(frag.layout()));
      for (int r = 0; r < size<0>(s_rc); ++r)
        for (int j = 0; j < size<1>(s_rc); ++j) s_rc(r, j) = 1.f;
      if constexpr (kKeyRows) {
        auto queries = [&](int row, int col0, int& lo, int& hi) {
          mask.row_queries(n0 + row, i0 + col0, lo, hi);
        };
        if (mask.left < 0 && i0 + kBlockM <= nq MUTATE_KEY_ROWS) {
          mask_row_ranges<true, false>(s_rc, c_rc, queries, 0.f);
        } else {
          mask_row_ranges<true, true>(s_rc, c_rc, queries, 0.f);
        }
      } else {
        auto keys = [&](int row, int col0, int& lo, int& hi) {
          mask.row_columns(i0 + row, n0 + col0, lo, hi);
        };
        if (mask.left < 0 MUTATE_QUERY_ROWS) {
          mask_row_ranges<false, true>(s_rc, c_rc, keys, 0.f);
        } else {
          mask_row_ranges<true, true>(s_rc, c_rc, keys, 0.f);
        }
      }
      for (int r = 0; r < size<0>(s_rc); ++r)
        for (int j = 0; j < size<1>(s_rc); ++j) {
          const int a = get<0>(c_rc(r, j)), bcol = get<1>(c_rc(r, j));
          const int qi = i0 + (kKeyRows ? bcol : a), kj = n0 + (kKeyRows ? a : bcol);
          const bool vis = mask.visible(qi, kj);
          (vis ? shown : hidden) += 1;
          CHECK(s_rc(r, j) == (vis ? 1.f : 0.f),
                "%s: nq %d nk %d left %d right %d shift %d tile (%d, %d) thread %d: query %d key "
                "%d %s but got %g\n",
                name, nq, nk, left, right, shift, i0, n0, tid, qi, kj,
                vis ? "visible" : "hidden", double(s_rc(r, j)));
        }
    }
  }
  std::printf("%s: %d cut tiles, %d scores hidden, %d visible\n", name, tiles, hidden, shown);
  CHECK(tiles > trials / 10 && hidden > 0 && shown > 0, "%s: too few cut tiles tested\n", name);
}

int main() {
  using bf16 = __nv_bfloat16;
  // fa3 mode's d = 256 pass (80-key blocks on 64 queries; variant 34's form)
  check<gproj::sm90::BwdKvDkvtTraits<bf16, 256>, false>("d256 80-key pass", 1, 3000);
  // the 64-row pass (d = 128; variant 23's form) and the 128-row pass (d = 64's default)
  check<gproj::sm90::BwdKvTraits<bf16, 128, false>, true>("d128 64-row pass", 2, 3000);
  check<gproj::sm90::BwdKvTraits<bf16, 64, false, 3, true, 2, 128, false, true, 40>, true>(
      "d64 128-row pass", 3, 3000);
  return report();
}
