// Host-side check of the Hopper backward's dq_accum tile layout (csrc/common/tile.cuh), built
// and run by tests/test_host_layout.py with nvcc, no GPU needed:
//  * dq_accum_offset / dq_accum_coord are inverse, and the offsets of one tile are a permutation
//    of 0 .. 64 D - 1;
//  * the (row, column) they give for value i of lane t of warpgroup w is where CuTe's own
//    partition of the dQ WGMMA accumulator (the kernel's TiledMmaDQ shape) puts that value: the
//    kernel stores tdQrdQ(i) at dq_accum_offset(w, D, i, t) and dq_finish_kernel trusts
//    dq_accum_coord to find it again;
//  * the lambda of value i is the one of row r0 + 8 ((i >> 1) & 1) (the gproj dQ combination);
//  * the same for the 80-row tiles of fa3 mode's d = 128 variant 39 (dQ^T's m64n80 accumulator:
//    dq_accum_t_coord, with the kernel's staging offset (i / 4) 512 + 4 t + i % 4 per warpgroup);
//  * dq_tile_base gives every sequence of a varlen batch its own tiles, 64 or 80 rows each.
#include <cstdio>
#include <vector>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>

#include "../../csrc/common/tile.cuh"
#include "host_check.h"

using namespace cute;


template <int D>
void check_head_dim() {
  using Mma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<cutlass::bfloat16_t, cutlass::bfloat16_t, float,
                           Shape<_64, Int<D / 2>, _128>, GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));  // as bwd_kv_sm90.cuh: the warpgroups split the head dim
  Mma mma;
  std::vector<int> seen(64 * D, 0);
  for (int tid = 0; tid < 256; ++tid) {
    auto thr = mma.get_thread_slice(tid);
    auto coords = thr.partition_C(make_identity_tensor(Shape<_64, Int<D>>{}));
    const int w = tid / 128, t = tid % 128;
    CHECK(int(size(coords)) == D / 4, "D=%d: %d values per lane, expected %d\n", D,
          int(size(coords)), D / 4);
    const int r0 = get<0>(coords(0));
    for (int i = 0; i < int(size(coords)); ++i) {
      const int row = get<0>(coords(i)), col = get<1>(coords(i));
      const int off = gproj::dq_accum_offset(w, D, i, t);
      CHECK(off >= 0 && off < 64 * D, "D=%d w=%d t=%d i=%d: offset %d out of the tile\n", D, w, t,
            i, off);
      if (off < 0 || off >= 64 * D) continue;
      ++seen[off];
      int r, c;
      gproj::dq_accum_coord(off, D, r, c);
      CHECK(r == row && c == col, "D=%d w=%d t=%d i=%d: CuTe (%d, %d), dq_accum_coord (%d, %d)\n",
            D, w, t, i, row, col, r, c);
      CHECK(row == r0 + 8 * ((i >> 1) & 1), "D=%d t=%d i=%d: row %d, expected r0 %d + 8 ((i >> 1) & 1)\n",
            D, tid, i, row, r0);
    }
  }
  for (int o = 0; o < 64 * D; ++o)
    CHECK(seen[o] == 1, "D=%d: offset %d written %d times\n", D, o, seen[o]);
}

// Variant 39's dQ^T = K^T dS~^T (bwd_kv_sm90.cuh, kDqT): M = the head dim split over the two
// warpgroups, N = 80 queries, K = 128 keys; the kernel stages value i of lane t of warpgroup w
// at w 40 D + (i / 4) 512 + 4 t + i % 4 of the tile.
void check_transposed_80() {
  constexpr int D = 128, M = 80;
  using Mma = decltype(make_tiled_mma(
      GMMA::ss_op_selector<cutlass::bfloat16_t, cutlass::bfloat16_t, float,
                           Shape<_64, Int<M>, _128>, GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  Mma mma;
  std::vector<int> seen(M * D, 0);
  for (int tid = 0; tid < 256; ++tid) {
    auto thr = mma.get_thread_slice(tid);
    auto coords = thr.partition_C(make_identity_tensor(Shape<Int<D>, Int<M>>{}));  // (d, query)
    const int w = tid / 128, t = tid % 128;
    CHECK(int(size(coords)) == 40, "80 rows: %d values per lane, expected 40\n", int(size(coords)));
    for (int i = 0; i < int(size(coords)); ++i) {
      const int dcol = get<0>(coords(i)), query = get<1>(coords(i));
      const int off = w * (M * D / 2) + (i / 4) * 512 + 4 * t + i % 4;
      CHECK(off >= 0 && off < M * D, "80 rows w=%d t=%d i=%d: offset %d out of the tile\n", w, t,
            i, off);
      if (off < 0 || off >= M * D) continue;
      ++seen[off];
      int r, c;
      gproj::dq_accum_t_coord(off, D, r, c);
      CHECK(r == query && c == dcol,
            "80 rows w=%d t=%d i=%d: CuTe (query %d, column %d), dq_accum_t_coord (%d, %d)\n", w,
            t, i, query, dcol, r, c);
    }
  }
  for (int o = 0; o < M * D; ++o)
    CHECK(seen[o] == 1, "80 rows: offset %d written %d times\n", o, seen[o]);
}

template <int kRows>
void check_varlen_tiles() {
  gproj::AttnParams p;
  const int cu[] = {0, 100, 100, 400, 401, 529, 600};  // an empty sequence, lengths 1 and 300
  const int batch = 6;
  p.batch = batch;
  p.total_q = cu[batch];
  p.cu_seqlens_q = 1;  // only tested for non-zero
  int prev_end = 0;
  for (int b = 0; b < batch; ++b) {
    const int n = cu[b + 1] - cu[b], base = gproj::dq_tile_base<kRows>(p, b, cu[b]);
    const int end = base + (n + kRows - 1) / kRows;
    CHECK(base >= prev_end, "varlen %d: sequence %d starts at tile %d, before %d\n", kRows, b,
          base, prev_end);
    CHECK(end <= gproj::dq_accum_tiles<kRows>(p), "varlen %d: sequence %d ends at tile %d of %d\n",
          kRows, b, end, gproj::dq_accum_tiles<kRows>(p));
    prev_end = end;
  }
  p.cu_seqlens_q = 0;  // dense: batch x seqlen_q
  p.seqlen_q = 1000;
  prev_end = 0;
  for (int b = 0; b < batch; ++b) {
    const int base = gproj::dq_tile_base<kRows>(p, b, 0);
    CHECK(base >= prev_end, "dense %d: sequence %d starts at tile %d, before %d\n", kRows, b,
          base, prev_end);
    prev_end = base + (p.seqlen_q + kRows - 1) / kRows;
  }
  CHECK(prev_end <= gproj::dq_accum_tiles<kRows>(p), "dense %d: %d tiles needed, %d allocated\n",
        kRows, prev_end, gproj::dq_accum_tiles<kRows>(p));
}

int main() {
  check_head_dim<64>();
  check_head_dim<128>();
  check_head_dim<256>();
  check_transposed_80();
  check_varlen_tiles<64>();
  check_varlen_tiles<80>();
  return report("dq_accum layout: ");
}
