// What the Hopper KV-outer backward passes share (bwd_kv_sm90.cuh: each consumer warpgroup owns
// its own 64 keys; bwd_kv_split_sm90.cuh: d = 256, the head dim split between them;
// bwd_kv_dkvt_sm90.cuh: fa3 mode at d = 256, 80 keys, dK and dV transposed): the block's work
// list, the host's TMA set-up, the producer thread's TMA loads, the rounding of accumulators into
// 16-bit operands, and the dK / dV stores of the epilogue (the first two passes; the third has
// its own loads and transposed stores).
#pragma once

#include "../common/sm90.cuh"
#include "../common/tile.cuh"

namespace gproj {
namespace sm90 {

// The work of a KV-outer block: every (query head of kv head hk's group, query tile of bm rows)
// pair whose queries see some of the keys [n0, n_end), as items 0 .. n_items - 1, in one of two
// orders:
// - head-major (tiles_outer false): a head's tiles in order, head after head (gproj's passes rely
//   on it: their rank-one term closes each head on its last tile);
// - tile-major (tiles_outer true, fa3 mode under a causal-like mask with GQA): from the last
//   query tile down, the group's heads inner. Why: head-major, the blocks of one kv head drift
//   apart across its query heads under a causal mask (block n spends 2 (N/128 - n) tiles on a
//   head at d = 128), so the pair's Q, dO and dq_accum of all its heads are in flight at once:
//   N x d x 8 bytes per query head, 32 MB per kv head at N = 4k, eight of them in the first wave
//   of the speed grid's GQA shape (16 heads, 2 kv heads), far beyond L2. From the last tile down
//   every block that starts together reads the same (head, tile) at the same time, whatever its
//   range: a tile leaves L2 once, and each block's masked diagonal tiles come last. (Session 36
//   measured what the drift costs: the same problem with K and V expanded to 16 heads ran 3-8%
//   faster under a causal mask; bench/NOTES.md session 36 item 3.)
// The block's query heads are head0 .. head0 + heads - 1: the kv head's whole group, or (fa3 mode,
// AttnParams::kv_head_splits) one share of it.
// Head-major with a rotation (rot > 0; fa3 mode's variant 33, compiled in as kRotated): each
// head's tiles from mb_min + rot up, then mb_min .. mb_min + rot - 1. The device constructor
// starts a block at its own diagonal tile (the tile of query row n0; mb_min under a causal
// mask, so rot = 0 there). Why: without a mask every block of a head otherwise starts at tile 0
// and walks in step with the others, so all of them reduce-add into the same dq_accum tile and
// read the same Q / dO tile at once (128 blocks per head at d = 128, N = 16k); rotated, they
// spread over the head's tiles (its Q, dO and dq_accum: 16 MB at d = 128, N = 16k, in L2).
struct KeyBlockWork {
  int head0, heads, mb_min, tiles_per_head, n_items, rot;
  bool tiles_outer;
  // query tiles [mb_min, mb_max) of each head
  __host__ __device__ __forceinline__ KeyBlockWork(int head0_, int heads_, int mb_min_, int mb_max,
                                                   bool tiles_outer_, int rot_ = 0)
      : head0(head0_), heads(heads_), mb_min(mb_min_), tiles_per_head(mb_max - mb_min_),
        n_items((mb_max - mb_min_) * heads_), rot(tiles_outer_ ? 0 : rot_),
        tiles_outer(tiles_outer_) {}
  // the query tiles of bm rows that see some of the keys [n0, n_end); rotated: from the tile of
  // query row n0 (cyclically)
  __device__ __forceinline__ KeyBlockWork(const Mask& mask, int n0, int n_end, int bm, int head0_,
                                          int heads_, bool tiles_outer_ = false,
                                          bool rotated = false)
      : KeyBlockWork(head0_, heads_, 0, 0, tiles_outer_) {
    int mb_max;
    mask.query_blocks(n0, n_end, bm, mb_min, mb_max);
    tiles_per_head = mb_max - mb_min;
    n_items = tiles_per_head * heads;
    if (rotated && !tiles_outer && tiles_per_head > 1) {
      const int r = (n0 / bm - mb_min) % tiles_per_head;
      rot = r < 0 ? r + tiles_per_head : r;
    }
  }
  __host__ __device__ __forceinline__ int head(int it) const {
    return head0 + (tiles_outer ? it % heads : it / tiles_per_head);
  }
  __host__ __device__ __forceinline__ int tile(int it) const {
    return tiles_outer ? mb_min + tiles_per_head - 1 - it / heads
                       : mb_min + (it % tiles_per_head + rot) % tiles_per_head;
  }
};

// The consumers' walk over a KeyBlockWork's items: item it's head and query tile, then the next
// item's by a step instead of KeyBlockWork::head / tile's division per item (~25 instructions a
// tile on every consumer warp and as many again on the row-fetching lanes, SASS of session 37).
// tests/host/kv_item_order.cu checks it against head / tile in both orders.
struct ItemCursor {
  int h, mb;
  __host__ __device__ __forceinline__ explicit ItemCursor(const KeyBlockWork& w)
      : h(w.head0), mb(w.tiles_outer ? w.mb_min + w.tiles_per_head - 1 : w.mb_min + w.rot) {}
  // (kRotated: the work may have rot > 0, KeyBlockWork's rotated order; a template argument so
  // that the passes without it keep their registers: at run time it cost the d = 64 pass a spill)
  template <bool kRotated = false>
  __host__ __device__ __forceinline__ ItemCursor next(const KeyBlockWork& w) const {
    ItemCursor n = *this;
    if (w.tiles_outer) {  // the heads inner, the tiles from the last down
      if (++n.h == w.head0 + w.heads) {
        n.h = w.head0;
        --n.mb;
      }
    } else if constexpr (kRotated) {  // the next head once the tiles are back at mb_min + rot
      if (++n.mb == w.mb_min + w.tiles_per_head) n.mb = w.mb_min;
      if (n.mb == w.mb_min + w.rot) ++n.h;
    } else if (++n.mb == w.mb_min + w.tiles_per_head) {  // head-major
      n.mb = w.mb_min;
      ++n.h;
    }
    return n;
  }
};

// A kv head's query heads split over p.kv_head_splits blocks per key tile (AttnParams::
// kv_head_splits; fa3 mode, and gproj's d = 256 pass: kGProj, its 64-key tiles): every consumer
// thread (tid of 256) adds its dK and dV accumulator values, this block's partial sums over its
// share of the group, into the slot of key tile n_block of pair (b, hk) in p.dkv_accum (params.h:
// float4 reductions at L2, fire and forget). The pre-pass that writes rowstate zeroes the pair's
// sums and counters before counting the pair's rows (zero_split_sums_share), which a block with
// items has waited for before its first tile; one without (keys no query sees: has_items false)
// waits for them here, whole warp (nq: the sequence's query rows). Then one thread counts the
// block in the tile's counter. Returns whether this block was the tile's last to count; if so,
// dK and dV now hold the sums over all the group's query heads, read back from L2, and the
// caller stores them as it would its own (the other blocks store nothing). Why the last block and
// not a post-pass (FlashAttention-3's GQA backward converts its fp32 dK / dV sums in its
// postprocess kernel): the sums are still in L2 when the last partial lands, and no launch
// waits for the whole pass. The order in which blocks add varies: dK and dV are not bitwise
// reproducible this way (deterministic=True takes the mma.sync passes in fa3 mode).
// Ordering: each thread's reductions, then its fence, then the barrier (`sync`, both consumer
// warpgroups), then the count (the CUDA programming guide's last-block pattern); the last block
// fences again before its loads, which go to L2 (ld.global.cg: L1 is not coherent).
template <int kHeadDim, bool kGProj, class Acc, class Sync>
__device__ __forceinline__ bool sum_split_partials(const AttnParams& p, int b, int hk, int n_block,
                                                   int nq, bool has_items, int tid, Acc& dk,
                                                   Acc& dv, int* last_flag, Sync sync) {
  constexpr int kValues = decltype(size(dk))::value, kThreads = 256;
  static_assert(kValues % 4 == 0 && kThreads * kValues == dkv_tile_keys(kHeadDim, kGProj) * kHeadDim,
                "the 256 consumer threads' float4s cover the tile's keys x head dim");
  if (!has_items && p.pair_counters) {
    if (tid < 32)
      counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) + b * p.heads_k + hk,
                           nq * (p.heads / p.heads_k));
    sync();
  }
  const int64_t tile = (int64_t(b) * p.heads_k + hk) * dkv_tiles_per_head(p) + n_block;
  float* slot = reinterpret_cast<float*>(p.dkv_accum) + tile * dkv_tile_floats(p) + 4 * tid;
  int* counter = reinterpret_cast<int*>(reinterpret_cast<float*>(p.dkv_accum) +
                                        dkv_key_tiles(p) * dkv_tile_floats(p)) + tile;
  auto add = [&](Acc const& acc, float* base) {
    CUTLASS_PRAGMA_UNROLL
    for (int c = 0; c < kValues / 4; ++c)
      asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                       base + c * 4 * kThreads),
                   "f"(acc(4 * c)), "f"(acc(4 * c + 1)), "f"(acc(4 * c + 2)), "f"(acc(4 * c + 3))
                   : "memory");
  };
  add(dk, slot);
  add(dv, slot + kValues * kThreads);
  __threadfence();
  sync();
  if (tid == 0) *last_flag = atomicAdd(counter, 1) == p.kv_head_splits - 1;
  sync();
  const bool last = *last_flag;
  if (last) {
    __threadfence();
    auto load = [&](Acc& acc, const float* base) {
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kValues / 4; ++c) {
        const float4 x = __ldcg(reinterpret_cast<const float4*>(base + c * 4 * kThreads));
        acc(4 * c) = x.x;
        acc(4 * c + 1) = x.y;
        acc(4 * c + 2) = x.z;
        acc(4 * c + 3) = x.w;
      }
    };
    load(dk, slot);
    load(dv, slot + kValues * kThreads);
  }
  return last;
}

// The key sums' first stage in both KV-outer passes (gproj with dK projected, dk_project.cuh):
// per column, the lane's Σ of alpha dK over its key rows before n_end, in fp64 and row order,
// then over the eight lanes that share its columns (a fixed order); per row, its squared norm
// over the quad that holds it (fp32), which the caller combines into Σ_j ||dK_j|| (whole rows,
// or two halves of the head dim). dk_rc / dkc_rc: the dK accumulator and its coordinates as
// (rows, columns).
template <int kRows, int kCols, class DkRC, class DkcRC>
__device__ __forceinline__ void dk_key_partials(const DkRC& dk_rc, const DkcRC& dkc_rc, int n0,
                                                int n_end, float scale, double (&colsum)[kCols],
                                                float (&row_sq)[kRows]) {
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kCols; ++j) colsum[j] = 0.0;
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const bool ok = n0 + get<0>(dkc_rc(r, 0)) < n_end;
    float sq = 0.f;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kCols; ++j) {
      const float x = ok ? scale * dk_rc(r, j) : 0.f;
      sq = fmaf(x, x, sq);
      colsum[j] += double(x);
    }
    row_sq[r] = quad_sum(sq);
  }
  CUTLASS_PRAGMA_UNROLL
  for (int j = 0; j < kCols; ++j)
    CUTLASS_PRAGMA_UNROLL
    for (int m = 4; m < 32; m <<= 1) colsum[j] += __shfl_xor_sync(0xffffffffu, colsum[j], m);
}

// Host: the extents and TMA loads of a KV-outer pass (Q and dO tiles of Traits::kBlockM rows
// into SmemLayoutQ, K, K' and V tiles of kBlockN rows into SmemLayoutK). Returns the maker of
// Q-like loads, for a pass that reads one more query tensor (gproj's Q').
template <class Traits, class Prm>
auto set_kv_pass_tmas(Prm& prm, const AttnParams& p, int total_q, int total_k) {
  constexpr int kHeadDim = Traits::kHeadDim;
  using E = typename Traits::Element;
  const bool varlen = p.cu_seqlens_q != 0;
  set_tma_extents(prm, p, total_q, total_k);
  auto tma_q = [varlen, rows = prm.rows_q, batch = prm.batch_q, heads = p.heads](
                   uint64_t ptr, const int64_t (&st)[3]) {
    return make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(ptr, rows, kHeadDim, heads, batch, st, varlen),
                         take<0, 2>(typename Traits::SmemLayoutQ{}),
                         Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{}, _1{});
  };
  auto tma_k = [&](uint64_t ptr, const int64_t (&st)[3]) {
    return make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(ptr, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, st, varlen),
                         typename Traits::SmemLayoutK{}, Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{}, _1{});
  };
  prm.tma_q = tma_q(p.q, p.q_stride);
  prm.tma_do = tma_q(p.dout, p.do_stride);
  prm.tma_k = tma_k(p.k, p.k_stride);
  prm.tma_kc = p.k_centered ? tma_k(p.k_centered, p.kc_stride) : prm.tma_k;
  prm.tma_v = tma_k(p.v, p.v_stride);
  return tma_q;
}

// fp32 accumulator -> rounded 16-bit register tensor, two values per conversion instruction
// (adjacent accumulator values are one lane's column pair).
template <typename T, class Acc, class Out>
__device__ __forceinline__ void round_pairs(Acc const& acc, Out& out) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc); i += 2)
    reinterpret_cast<uint32_t*>(out.data())[i / 2] = pack2<T>(acc(i), acc(i + 1));
}

// The producer thread: K and V of key tile n_block once (on barrier_kv; K' where the keys are
// centered), then for each of the block's (query head, query tile) items (work, in its order:
// an ItemCursor, no division per item), Q and dO into the next stage of pipe_q, and with kLoadQc
// (the gproj pass of bwd_kv_sm90.cuh) the centered queries Q' as well: Q' where centered,
// elsewhere Q' = Q, loaded twice (the consumers' dK GEMM reads sQc). `prm` has the pass's TMA
// loads and extents (tma_qc only with kLoadQc). With `pipe_do` (fa3 mode's A/B form
// kSplitDoPipe) dO goes into that ring's stage instead, acquired on its own: its consumers free
// it once dV is done, before Q's. kRotated: work's order may be rotated (ItemCursor::next).
template <bool kLoadQc, int kBlockM, int kBlockN, int kHeadDim, bool kRotated = false, class Prm,
          class TK, class TQ, class Pipeline>
__device__ __forceinline__ void produce_kv_pass_tiles(
    Prm const& prm, const AttnParams& p, const SeqBounds& seq, int b, int bq, int hk, int n_block,
    const KeyBlockWork& work, TK& sK, TK& sV, TQ& sQ, TQ& sDO, TQ& sQc,
    cutlass::arch::ClusterTransactionBarrier& barrier_kv, Pipeline& pipe_q,
    Pipeline* pipe_do = nullptr) {
  using Element = typename TK::value_type;
  auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  auto tile_k = Shape<Int<kBlockN>, Int<kHeadDim>>{};
  auto const& tma_k = reads_centered_keys(p, b, hk) ? prm.tma_kc : prm.tma_k;
  Tensor mK = tma_rows(tma_k, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
  Tensor mV = tma_rows(prm.tma_v, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
  auto [tKg, tKs] = tma_partition(tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                  group_modes<0, 2>(local_tile(mK, tile_k, make_coord(n_block, _0{}))));
  auto [tVg, tVs] = tma_partition(prm.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                  group_modes<0, 2>(local_tile(mV, tile_k, make_coord(n_block, _0{}))));
  barrier_kv.arrive_and_expect_tx(2 * kBlockN * kHeadDim * int(sizeof(Element)));
  copy(tma_k.with(reinterpret_cast<uint64_t&>(barrier_kv), 0), tKg, tKs);
  copy(prm.tma_v.with(reinterpret_cast<uint64_t&>(barrier_kv), 0), tVg, tVs);
  auto wr = cutlass::make_producer_start_state<Pipeline>();
  ItemCursor cur(work);
  for (int it = 0; it < work.n_items; ++it, cur = cur.next<kRotated>(work)) {
    const int h = cur.h, mb = cur.mb;
    auto load = [&](auto const& tma, auto& smem, Pipeline& pipe) {
      Tensor m = tma_rows(tma, prm.rows_q, kHeadDim, p.heads, prm.batch_q, seq.q_start, h, bq);
      auto [tg, ts] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(smem),
                                    group_modes<0, 2>(local_tile(m, tile_q, make_coord(_, _0{}))));
      copy(tma.with(*pipe.producer_get_barrier(wr), 0), tg(_, mb), ts(_, wr.index()));
    };
    pipe_q.producer_acquire(wr);
    load(prm.tma_q, sQ, pipe_q);
    if (pipe_do) pipe_do->producer_acquire(wr);  // (the same stage index: both rings advance together)
    load(prm.tma_do, sDO, pipe_do ? *pipe_do : pipe_q);
    if constexpr (kLoadQc) load(reads_centered_queries(p, b, h) ? prm.tma_qc : prm.tma_q, sQc, pipe_q);
    ++wr;
  }
}

// The epilogue's stores of this thread's dK and dV accumulator values (coordinates tdKcdK: key
// row j of the block's keys n0.., head dim column), rows past the end dropped: dV rounded, dK
// scaled by alpha and rounded, unless kFp32DkOnly (A in one part: dK leaves in fp32 only, in
// p.dk_unprojected, for dk_project.cuh); fp32 dK also into p.dk_accum where the caller asked.
// (kStoreDv false: dK alone, dV having gone through store_dk_dv_epilogue's staged stores.)
template <typename T, bool kFp32DkOnly, bool kStoreDv = true, class Acc, class Coords>
__device__ __forceinline__ void store_dk_dv(const AttnParams& p, const SeqBounds& seq, int b,
                                            int hk, int n0, int n_end, Acc const& tdKrdK,
                                            Acc const& tdVrdV, Coords const& tdKcdK) {
  const int64_t k_row0 = seq.k_start + n0;
  T* gDK = reinterpret_cast<T*>(p.dk) + b * p.dk_stride[0] + k_row0 * p.dk_stride[1] + hk * p.dk_stride[2];
  T* gDV = reinterpret_cast<T*>(p.dv) + b * p.dv_stride[0] + k_row0 * p.dv_stride[1] + hk * p.dv_stride[2];
  float* gDKacc = p.dk_accum ? reinterpret_cast<float*>(p.dk_accum) + b * p.dk_stride[0] +
                                   k_row0 * p.dk_stride[1] + hk * p.dk_stride[2]
                             : nullptr;
  float* gDKf = kFp32DkOnly ? reinterpret_cast<float*>(p.dk_unprojected) + b * p.dk_stride[0] +
                                  k_row0 * p.dk_stride[1] + hk * p.dk_stride[2]
                            : gDKacc;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tdKrdK); i += 2) {
    const int j = get<0>(tdKcdK(i)), col = get<1>(tdKcdK(i));
    if (n0 + j >= n_end) continue;
    const float k0 = p.softmax_scale * tdKrdK(i), k1 = p.softmax_scale * tdKrdK(i + 1);
    if constexpr (!kFp32DkOnly)
      *reinterpret_cast<uint32_t*>(gDK + int64_t(j) * p.dk_stride[1] + col) = pack2<T>(k0, k1);
    if constexpr (kStoreDv)
      *reinterpret_cast<uint32_t*>(gDV + int64_t(j) * p.dv_stride[1] + col) =
          pack2<T>(tdVrdV(i), tdVrdV(i + 1));
    if (gDKf)
      *reinterpret_cast<float2*>(gDKf + int64_t(j) * p.dk_stride[1] + col) = make_float2(k0, k1);
  }
}

// The epilogue's dK (scaled by alpha) and dV, rows past the end dropped. 16-bit ones go through
// the K and V tiles' shared memory (stage_and_store_rows) where the rows allow it: each consumer
// warpgroup its rows [r0, r0 + 64) x columns [c0, c0 + kCols) (its own 64 keys, or at d = 256
// its half of the head dim), after `sync()` has made sure that no warpgroup still reads what it
// overwrites. kFp32Dk (A in one part: dK leaves in fp32 only, for dk_project.cuh): dV staged, dK
// from the accumulators (8-byte stores: a whole 32-byte sector of a row per four lanes). Else
// (misaligned rows, fp32 dK asked for in p.dk_accum, GPROJ_FWD_AB bit 32) store_dk_dv alone.
// Measured against store_dk_dv's 4-byte stores, each of which touches 8 rows per warp
// (GPROJ_FWD_AB=32), interleaved (bench/NOTES.md session 19), the whole fa3 backward: -2.6 to
// -5.3% at N = 2k-4k (d = 64, 128, 256), -0.5 to -1.4% at 8k-16k; gproj's (dV here, dQ in its
// Q-outer pass): -0.5 to -2.0%.
template <typename T, int kCols, bool kFp32Dk, class Sync, class TiledMma, class Acc,
          class Coords, class SmemTile>
__device__ __forceinline__ void store_dk_dv_epilogue(const AttnParams& p, const SeqBounds& seq,
                                                     int b, int hk, int n0, int n_end, int r0,
                                                     int c0, int w, int tid, Sync sync,
                                                     TiledMma const& mma_kv, Acc const& tdKrdK,
                                                     Acc const& tdVrdV, Coords const& tdKcdK,
                                                     SmemTile& sK, SmemTile& sV) {
  using Element = typename SmemTile::value_type;
  const bool staged = rows_stageable(p, p.dv, p.dv_stride) &&
                      (kFp32Dk || (p.dk_accum == 0 && rows_stageable(p, p.dk, p.dk_stride)));
  if (!staged) {
    store_dk_dv<T, kFp32Dk>(p, seq, b, hk, n0, n_end, tdKrdK, tdVrdV, tdKcdK);
    return;
  }
  sync();
  const int64_t k_row0 = seq.k_start + n0;
  if constexpr (!kFp32Dk) {
    Tensor rDK = make_tensor_like<Element>(tdKrdK);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2)
      reinterpret_cast<uint32_t*>(rDK.data())[i / 2] =
          pack2<T>(p.softmax_scale * tdKrdK(i), p.softmax_scale * tdKrdK(i + 1));
    T* gDK = reinterpret_cast<T*>(p.dk) + b * p.dk_stride[0] + k_row0 * p.dk_stride[1] + hk * p.dk_stride[2];
    stage_and_store_rows<kCols>(gDK, p.dk_stride[1], n_end - n0, r0, c0, w, tid, mma_kv, rDK, sK);
  }
  Tensor rDV = make_tensor_like<Element>(tdVrdV);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tdVrdV); i += 2)
    reinterpret_cast<uint32_t*>(rDV.data())[i / 2] = pack2<T>(tdVrdV(i), tdVrdV(i + 1));
  T* gDV = reinterpret_cast<T*>(p.dv) + b * p.dv_stride[0] + k_row0 * p.dv_stride[1] + hk * p.dv_stride[2];
  stage_and_store_rows<kCols>(gDV, p.dv_stride[1], n_end - n0, r0, c0, w, tid, mma_kv, rDV, sV);
  if constexpr (kFp32Dk) store_dk_dv<T, true, false>(p, seq, b, hk, n0, n_end, tdKrdK, tdVrdV, tdKcdK);
}

}  // namespace sm90
}  // namespace gproj
