// Forward attention for Hopper (sm_90a): TMA loads, WGMMA, warp-specialized.
//
// Block = one producer warpgroup + two consumer warpgroups on a 128-row query tile (64 rows per
// consumer warpgroup; three on 192 rows at d = 64 from N = 2k without a mask, 8k with one:
// forward_impl in tile_configs.cuh). The producer's elected thread issues TMA loads of Q (once) and of K and V
// tiles into a kStages-deep ring guarded by mbarrier pipelines; it keeps only a few registers
// (setmaxnreg) so the consumers can hold the O accumulator and S in registers.
// Consumers per key tile: S = Q K^T (WGMMA, both operands in shared memory), mask, online
// softmax, P rounded once into A-operand registers, O += P V (WGMMA, P from registers).
//
// Numerics are those of the mma.sync kernel (fwd_kernel.cuh) and reference.py:
//   gproj: p = exp2((s - m) * c), the raw row max subtracted before scaling (exact max: 1);
//   fa3:   p = exp2(fma(s, c, -m * c)), FlashAttention-3's form.
#pragma once

#include <algorithm>

#include <cutlass/fast_math.h>

#include "../api/params.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/pdl.cuh"
#include "../common/sm90.cuh"
#include "../common/tile.cuh"

namespace gproj {
namespace sm90 {

using namespace cute;

template <typename T_, int kHeadDim_, int kBlockN_, int kStages_, bool kPingpong_,
          bool kPersistent_, bool kSkipRescale_ = true, int kMmaWarpGroups_ = 2,
          bool kPvFromSmem_ = false, bool kPvWaitAtTop_ = (kHeadDim_ >= 128),
          bool kKWaitFirst_ = false, bool kPvWaitInSoftmax_ = false>
struct FwdTraits : Sm90Tiles<T_, kHeadDim_, kBlockN_, kStages_, kMmaWarpGroups_> {
  using Base = Sm90Tiles<T_, kHeadDim_, kBlockN_, kStages_, kMmaWarpGroups_>;
  using typename Base::Element;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutQ;
  using typename Base::Pipeline;
  static constexpr int kHeadDim = kHeadDim_, kBlockN = kBlockN_, kStages = kStages_;
  // Pingpong: the two consumer warpgroups take turns issuing their GEMMs (named barriers), so
  // one's softmax runs while the other's GEMMs occupy the tensor cores.
  static constexpr bool kPingpong = kPingpong_;
  // Persistent: one block per SM loops over query tiles (longest first for causal masks, heads
  // grouped so that their K/V stay in L2); with two Q buffers the next tile's Q and K/V load
  // while this tile's last P.V and epilogue run.
  static constexpr bool kPersistent = kPersistent_;
  // Skip the O rescale when no row max of the warp changed (multiplying by 1 is exact). Measured
  // (scripts/fwd_ab.py, bench/NOTES.md v4): +1-11% without pingpong (d = 64), -4 to +2% with
  // it, where the branch costs more than the multiplies it saves; so the default skips only
  // without pingpong and variant 2 does the opposite.
  static constexpr bool kSkipRescale = kSkipRescale_;
  // Where a warpgroup waits for its P.V GEMM: at the top of the next iteration (the softmax of
  // the next tile overlaps P.V), or after that softmax in the same basic block (where ptxas
  // hoists the wait above the softmax: no overlap). Interleaved A/B (bench/NOTES.md session 9):
  // d = 256 +2-5%, d = 128 +0-1%, d = 64 -2 to -7% with two consumer warpgroups (its softmax is
  // long next to its GEMMs and the other warpgroup's GEMMs already hide it); with three, 0 to -6%
  // (session 15 item 7: FwdTiles<64, 9>, the d = 64 default from N = 2k-4k).
  static constexpr bool kPvWaitAtTop = kPvWaitAtTop_;
  // The wait for K before the pingpong turn rather than after it (FlashAttention-3's order, its
  // SASS): a warpgroup holds the turn for the GEMM issue alone, never while its K tile lands,
  // and the mbarrier try-wait's latency is off the other warpgroup's path. Interleaved A/B
  // (bench/NOTES.md session 18): d = 128 gproj -0.6 to -1.8% at N = 2k-16k, causal or not, fa3
  // mode 0 to -1.7% (three runs); d = 64 fa3 mode -0.4 to -1.0%, gproj 0 to -0.2%; d = 256 +0.2
  // to +0.8% slower. The default at d = 64 and 128 (FwdTiles; variant 10: the other order).
  static constexpr bool kKWaitFirst = kKWaitFirst_;
  // P.V waited for inside the softmax, among its exponentials, with the O rescale and P's
  // conversion after it: FlashAttention-3's place (its d = 128 SASS: the wait after ~19 of a
  // thread's 66 MUFU, the F2FPs and the rescale's FMULs among the rest). Written so, ptxas
  // hoists the wait (WARPGROUP.DEPBAR) to the top of the softmax's basic block, before the row
  // max: no overlap with P.V at all (bench/NOTES.md sessions 9, 18). FlashAttention-3's wait
  // stays lower because its K release, an arrive that ptxas keeps before the wait, sinks into
  // the exp2 stream. Here that release is predicated on an exponential's value (kPvWaitAfter),
  // a data dependence that keeps the arrive, and the wait after it, below that MUFU. Interleaved
  // A/B against the wait at the top of the next iteration (kPvWaitAtTop; variant 11), with the O
  // rescale's skipping (run_forward), session 31: d = 128 N = 2k-16k fa3 mode -3 to -8%, gproj -2
  // to -9%; d = 64 fa3 mode -2 to -4%, gproj -1 to +1%; d = 256 fa3 mode 0 to -1%, gproj -1 to
  // -3.5% (bench/NOTES.md).
  static constexpr bool kPvWaitInSoftmax = kPvWaitInSoftmax_;
  static_assert(!(kPvWaitInSoftmax && kPvWaitAtTop), "one place for the P.V wait");
  using typename Base::SmemLayoutVt;  // V^T
  // P for O = P V: from registers (the S accumulator, rounded), or written to shared memory
  // (stmatrix) and read from there, FlashAttention-3's choice for d = 64 without a mask: with
  // no P registers, 192-key tiles fit three consumer warpgroups of 160 registers. A single P
  // buffer per warpgroup: P of tile n is written after P.V of tile n + 1 has been waited for
  // (so not with kPvWaitAtTop).
  static constexpr bool kPvFromSmem = kPvFromSmem_;
  static_assert(!(kPvFromSmem && kPvWaitAtTop), "P in shared memory: P.V waited for before P is written");
  using TiledMmaPV = std::conditional_t<
      kPvFromSmem,
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                               GMMA::Major::K, GMMA::Major::MN>(),
          typename Base::AtomLayout{})),
      typename Base::TiledMmaPV>;
  using SmemAtomP = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, Int<Base::kBlockM>, Int<kBlockN>>());
  using SmemLayoutP =
      decltype(tile_to_shape(SmemAtomP{}, Shape<Int<Base::kBlockM>, Int<kBlockN>>{}));
  struct NoPTiles {};
  struct PTiles {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> p;  // P of every consumer
  };

  // O leaves through the Q buffer by TMA stores, one per consumer warpgroup and 64-column
  // block: rows 64w.. of 128-byte column block c of SmemLayoutQ (8-row x 64-column 128-byte
  // swizzle atoms stacked along the rows first) are 8 KB at element (64 w + kBlockM c) * 64, laid
  // out as this (64, 64) tile of the same atom.
  static_assert(std::is_same_v<typename Base::SmemAtomQ, GMMA::Layout_K_SW128_Atom<Element>>,
                "O's TMA store assumes 128-byte swizzle atoms of 64 columns");
  using SmemLayoutOBlock = decltype(tile_to_shape(typename Base::SmemAtomQ{}, Shape<_64, _64>{}));
  // Two per-thread walks over 16-byte chunks of SmemLayoutQ (the Q buffer; O's staging, laid out
  // as Q) by shared address from their first chunk's, a0, instead of through CuTe's layout per
  // chunk: those addresses are the same for every tile, so ptxas formed them all before the
  // persistent loop and, at d = 256 (240 registers), kept them on the stack (80 bytes, the one
  // default forward that used local memory; issue 9 asks for none). The layout: column blocks of
  // 64 columns, kBlockM rows of 128 bytes each (kQColBlockBytes), 1024-aligned, in which the
  // 128-byte swizzle XORs a row's bits 0-2 into the address's bits 4-6 (a 16-byte chunk's place
  // in its line). tests/host/q_chunk_addresses.cu checks both walks against CuTe's layout for
  // every thread, warpgroup and head dim.
  static constexpr int kQColBlockBytes = Base::kBlockM * 128;
  // (1) Chunk 4 j + c of a row (c < 4, a0 chunk c's address): the column block j div 2 on, and
  //     chunk c + 4 (j mod 2) of its line, i.e. bit 2 of the chunk flipped: the q . shift dot
  //     products (lane c of a quad takes chunks c, c + 4, ...). Row r + 8 is 1024 bytes on.
  __host__ __device__ static uint32_t q_chunk_addr(uint32_t a0, int j) {
    return (a0 + uint32_t(kQColBlockBytes * (j / 2))) ^ uint32_t(64 * (j & 1));
  }
  // (2) Row r0 + kORowStep i of a chunk (r0 < kORowStep): kORowStep rows on (a multiple of 512
  //     bytes, no bit the swizzle reads) and, with a step of 4 rows (d = 256), the row's bit 2,
  //     which flips on every second row, XORed into the address's bit 6: where O cannot leave by
  //     TMA (a varlen sequence's partial last tile, GPROJ_FWD_AB bit 2), thread t of a consumer
  //     warpgroup copies chunk t mod kOChunks of its rows t div kOChunks + kORowStep i.
  static constexpr int kOChunks = kHeadDim / 8, kORowStep = 128 / kOChunks;
  static_assert(kORowStep == 4 || kORowStep % 8 == 0, "a row step that moves bits 4-6 of the "
                "swizzled address only as o_row_addr says");
  __host__ __device__ static uint32_t o_row_addr(uint32_t a0, int i) {
    return (a0 + uint32_t(128 * kORowStep * i)) ^ (kORowStep == 4 ? uint32_t(64 * (i & 1)) : 0u);
  }
  using TmaO = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), TmaGmemLayout{}),
      SmemLayoutOBlock{}, Shape<_64, _64>{}, _1{}));

  static constexpr int kQBytes = cute::cosize_v<SmemLayoutQ> * int(sizeof(Element));
  static constexpr int kKVBytes = 2 * cute::cosize_v<SmemLayoutK> * int(sizeof(Element));
  static constexpr int kQBuffers = (kPersistent && 2 * kQBytes + kKVBytes <= 220 * 1024) ? 2 : 1;
  // Persistent with one Q buffer (d = 256): O leaves through the V stages instead of the Q
  // buffer (FlashAttention-3's aliasing), so the consumers hand Q back once its last S GEMM is
  // done and the next tile's Q loads under this tile's last softmax, P.V and epilogue; the
  // producer holds the next tile's first V load until O's stores have read the stages
  // (o_free: phase 0 completed at the start, phase i + 1 by tile i's stores; every tile handed
  // over counts, those without keys too, and the producer waits for every phase in order, so
  // that tile qi's parity comes from the count of tiles it keeps anyway). Through the Q buffer,
  // the next Q could load only after the epilogue's stores, and the next tile's first S waited
  // for it: the persistent kernel was no faster than one tile per block (bench/NOTES.md session
  // 36).
  static constexpr bool kOThroughV = kPersistent && kQBuffers == 1;
  static_assert(!kOThroughV || cute::cosize_v<SmemLayoutK> >= cute::cosize_v<SmemLayoutQ>,
                "O staged in the V stages needs them at least as large as the Q buffer");

  struct SharedStorage {
    cute::array_aligned<Element, kQBuffers * cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    std::conditional_t<kPvFromSmem, PTiles, NoPTiles> p_tiles;  // (no bytes without it)
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q[kQBuffers];  // Q loaded
    alignas(16) cutlass::arch::ClusterBarrier q_empty[kQBuffers];  // consumers done with Q
    alignas(16) cutlass::arch::ClusterBarrier o_free;  // kOThroughV: O's stores have read V's stages
    alignas(16) typename Pipeline::SharedStorage pipe_k;
    alignas(16) typename Pipeline::SharedStorage pipe_v;
    int4 slot_tile;  // varlen slots (one-tile blocks): {m_block, head, sequence} of this block
    // Persistent: the schedule index of the tile whose Q goes to buffer i and its {m_block,
    // head, sequence}, written by the producer before it arrives on barrier_q[i] (an index past
    // the schedule: no more tiles). The consumers take the coordinates as decoded once.
    int tile_of[kQBuffers];
    int4 coord_of[kQBuffers];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

template <class Traits>
struct FwdKernelParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_kc;  // K' = K - c where centered (reads_centered_keys), else = tma_k
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;  // valid where o_tma
  // O through shared memory: a 16-bit output whose address and strides are 16-byte aligned
  // (16-byte stores, or a TMA tensor); o_tma: and by TMA stores (GPROJ_FWD_AB bit 2 clears it)
  int o_vec, o_tma;
  int rows_q, rows_k, batch_q;  // extents of the TMA tensors (varlen: packed rows, batch 1)
  int num_m_blocks;             // query tiles per (sequence, head) (longest sequence)
  // partial_first: query tile m of a sequence of nq rows holds the rows [m * kBlockM - s,
  // + kBlockM) that exist, s = -nq mod kBlockM (tile_rows): under a causal-like mask the tiles
  // end at the sequence's last row and the partial one is the first, whose rows see the fewest
  // keys, instead of the last, which sees them all. Where kBlockN divides kBlockM, s is rounded
  // down to a multiple of kBlockN and the last tile keeps the rest as padding rows. (The first
  // tile's Q buffer is loaded from the sequence's row 0 all the same: its rows past its end are
  // the next tile's, computed and never stored.)
  int partial_first;
  int sched_group;              // persistent: (sequence, head) pairs scheduled together
  // Persistent: the schedule's tiles (num_m_blocks x pairs) and its last group's index, set on
  // the host so that the producer's thread (24 registers) reads them from the parameters.
  int num_tiles, last_group;
  // The remainder group (the last pairs, fewer than G) scheduled first (decode_tile), unless
  // GPROJ_TILE_ORDER=3 asks for the order before session 32.
  int ragged_first;
  // Divisions of the tile decode (decode_tile) and of h -> kv head as multiply-high and shift:
  // a 32-bit integer division is ~25 instructions, and the persistent decode took five per
  // query tile and warp, ~130 of the ~1500 a tile spends outside its key loop at d = 128 N = 2k
  // causal (ncu, bench/NOTES.md session 14). Set on the host, in run_forward.
  cutlass::FastDivmod div_group_tiles;  // G * num_m_blocks: the tiles of a full group
  cutlass::FastDivmod div_group;        // G: a full group's pairs
  cutlass::FastDivmod div_last_group;   // the last group's pairs
  cutlass::FastDivmod div_heads;        // heads
  cutlass::FastDivmod div_heads_per_kv;  // heads / heads_k
  // Persistent under a mask: a zeroed counter from which the producers take their blocks' next
  // tiles (FlashAttention-3's scheme). Query tiles under a causal mask differ in length up to
  // N / kBlockN times, and dealt round robin (a static schedule) they leave the busiest block
  // with more work than the mean (scripts/sched_model.py). Measured against the round robin at
  // d = 128 (bench/NOTES.md session 15): causal 2k -3%, 4k -2.7%, 8k -1.9%; d = 64 -1%.
  // nullptr: the round robin.
  int* tile_counter;
  AttnParams p;
};

// Query tile t of the persistent schedule -> (m_block, head, batch). Groups of G (sequence, head)
// pairs are processed one after another (G chosen on the host so their K/V fit in L2); inside a
// group the tiles go by query block, longest first under a causal mask, across the group's pairs.
// The remainder group (pairs mod G of them) goes first (ragged_first, since session 32): last,
// its few pairs' long tiles started when the other blocks were running out of work (a model of
// the counter's schedule, scripts/sched_model.py: the busiest block 4-8% over the mean at d = 128
// N = 2k-16k causal, ~1% with the remainder first). Measured: d = 128 causal 2k / 4k -3%, d = 64
// causal 4k / 8k -2 to -3% (bench/NOTES.md session 32).
struct TileCoord {
  int m_block, h, b;
};
template <class Prm>
__device__ __forceinline__ TileCoord decode_tile(const Prm& prm, int t, bool longest_first) {
  const int G = prm.sched_group, num_m = prm.num_m_blocks;
  int group, r, mi, j, b, h;
  if (prm.ragged_first) {
    const int R = int(prm.div_last_group), ragged_tiles = R * num_m;
    if (t < ragged_tiles) {
      prm.div_last_group(mi, j, t);
      prm.div_heads(b, h, j);
    } else {
      prm.div_group_tiles(group, r, t - ragged_tiles);
      prm.div_group(mi, j, r);
      prm.div_heads(b, h, R + group * G + j);
    }
    return {longest_first ? num_m - 1 - mi : mi, h, b};
  }
  prm.div_group_tiles(group, r, t);
  if (group >= prm.last_group) {  // (the last group may hold fewer pairs)
    prm.div_last_group(mi, j, r);
  } else {
    prm.div_group(mi, j, r);
  }
  prm.div_heads(b, h, group * G + j);
  return {longest_first ? num_m - 1 - mi : mi, h, b};
}

// Persistent over a varlen batch's slots (p.slot_rows = kBlockM, tile.cuh): schedule index t is
// block t of the one-tile forward's slot grid, in its order (pair after pair, each pair's
// longest tile first under a causal-like mask: slot_tile), decoded by the producer's one thread
// with a binary search over cu_seqlens_q (varlen_slot's search needs a whole warp). An empty slot
// (at most one per sequence and head) decodes to m_block = the sequence's tile count: skipped.
// Why slots: over num_m_blocks x pairs, every sequence as long as the longest, most tiles of a
// batch of short sequences are empty, and the persistent schedule measured 8-20% slower than
// one-tile blocks (bench/NOTES.md session 13); over slots, with the tile counter, faster than
// both (session 35).
template <int kBlockM, class Prm>
__device__ __forceinline__ TileCoord decode_slot(const Prm& prm, int t, bool longest_first) {
  const AttnParams& p = prm.p;
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens_q);
  int slot, rem;
  prm.div_heads(slot, rem, t);  // (only the sequence's slot range is found from t / heads)
  int lo = 0, hi = p.batch;     // the largest b with s(b) = cu[b] / kBlockM + b <= slot
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (__ldg(cu + mid) / kBlockM + mid <= slot) lo = mid; else hi = mid;
  }
  const int start = __ldg(cu + lo), end = __ldg(cu + lo + 1);
  const int first = start / kBlockM + lo, count = end / kBlockM + lo + 1 - first;
  const int tiles = (end - start + kBlockM - 1) / kBlockM;
  const int local = t - p.heads * first, h = local / count, rank = local - h * count;
  if (rank >= tiles) return {tiles, h, lo};
  return {longest_first ? tiles - 1 - rank : rank, h, lo};
}

// The rows [m0, m_end) of query tile m_block in a sequence of nq rows (partial_first).
template <int kBlockM, int kBlockN, class Prm>
__device__ __forceinline__ void tile_rows(const Prm& prm, int m_block, int nq, int& m0, int& m_end) {
  const int shift = prm.partial_first ? (kBlockM - nq % kBlockM) % kBlockM : 0;
  // Where kBlockN divides kBlockM the shift keeps the diagonal on the key tiles' edges
  // (FwdKernelParams::partial_first): a multiple of kBlockN, the rest left to the last tile.
  constexpr int kAlign = kBlockM % kBlockN == 0 ? kBlockN : 1;
  const int lo = m_block * kBlockM - (shift - shift % kAlign);
  m0 = max(lo, 0);
  m_end = min(lo + kBlockM, nq);
}

template <class Traits, bool kGProj>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    fwd_sm90_kernel(CUTE_GRID_CONSTANT FwdKernelParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using Pipeline = typename Traits::Pipeline;
  const AttnParams& p = prm.p;

  constexpr int kQBuf = Traits::kQBuffers;
  constexpr int kWGs = Traits::kNumMmaWarpGroups;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    if (p.k_centered) cute::prefetch_tma_descriptor(prm.tma_kc.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kQBuf; ++i) {
      ss.barrier_q[i].init(1);
      ss.q_empty[i].init(Traits::kNumMmaThreads);
    }
    if constexpr (Traits::kOThroughV) {
      ss.o_free.init(kWGs);  // one arrive per consumer warpgroup and tile, after its O stores
      for (int i = 0; i < kWGs; ++i) ss.o_free.arrive();  // (phase 0: nothing staged before)
    }
  }
  // gproj at d = 64 and 128: launched as the programmatic dependent of the stream's previous
  // kernel (run_forward): the block's start-up above overlaps that kernel's end, and nothing in
  // global memory is read or written before it has ended (it is the centering pre-pass, which
  // writes the shift, the lazy flags and K'; a caller's cu_seqlens may come from the kernel
  // before). (Without a programmatic launch this returns at once.)
  pdl_wait_primary();
  if constexpr (!Traits::kPersistent) {
    // Varlen slots (p.slot_rows): warp 0 finds this block's sequence, head and query tile
    // (slot_tile) while thread 0 initializes the barriers. The order is the old grid's, pair
    // after pair. (Slots head by head, or heads fastest, measured up to 6% slower: a sequence of
    // 4k keys, its heads in flight at once, no longer kept its K and V in L2; bench/NOTES.md
    // session 14.)
    if (p.slot_rows && threadIdx.x < 32) {
      const GridTile gt = slot_tile(p, reinterpret_cast<const int*>(p.cu_seqlens_q), p.heads,
                                    /*longest_last=*/true);
      if (threadIdx.x == 0) ss.slot_tile = make_int4(gt.tile, gt.head, gt.batch, 0);
    }
  }
  const typename Pipeline::Params pp = Traits::ring_params(wg);
  Pipeline pipe_k(ss.pipe_k, pp, Shape<_1, _1, _1>{});
  Pipeline pipe_v(ss.pipe_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialized before anyone waits on them

  // The tiles of this block: one (the grid's coordinates), or, persistent, those of the schedule
  // its producer takes (from the tile counter, or every gridDim.x-th), handed to the consumers
  // one by one with their Q buffers.
  const int num_tiles = Traits::kPersistent ? prm.num_tiles : 1;
  const int first = Traits::kPersistent ? int(blockIdx.x) : 0;
  const int stride = Traits::kPersistent ? int(gridDim.x) : 1;
  auto tile_at = [&](int t) -> TileCoord {
    if constexpr (Traits::kPersistent) {
      if (p.slot_rows) return decode_slot<kBlockM>(prm, t, p.window_right >= 0);
      return decode_tile(prm, t, p.window_right >= 0);
    } else {
      if (p.slot_rows) return {ss.slot_tile.x, ss.slot_tile.y, ss.slot_tile.z};
      // (causal: the longest query tiles first, grid_tile)
      const GridTile gt = grid_tile</*kGrouped=*/true>(p, /*longest_last=*/true);
      return {gt.tile, gt.head, gt.batch};
    }
  };
  // The producer's next tile after t: from the tile counter (claimed; every block's first tile is
  // its blockIdx.x, so the counter's k-th ticket is tile gridDim.x + k), or the round robin's.
  auto next_tile = [&](int t) -> int {
    if constexpr (Traits::kPersistent) {
      if (prm.tile_counter != nullptr) return atomicAdd(prm.tile_counter, 1) + int(gridDim.x);
    }
    return t + stride;
  };
  auto q_buffer = [&](int i) {
    return make_tensor(make_smem_ptr(ss.q.data() + i * cute::cosize_v<typename Traits::SmemLayoutQ>),
                       typename Traits::SmemLayoutQ{});
  };
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});

  if (wg == 0) {
    // ---------------- producer ----------------
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegs>();
    if (threadIdx.x == 0) {
      RingCount<Traits::kStages, 1> wr_k, wr_v;  // (as make_producer_start_state)
      // Persistent: every tile goes to the consumers through a Q buffer (ss.tile_of, then
      // barrier_q), tiles without keys (no Q load) and the end of the schedule too, so the
      // consumers follow whatever order the producer took. One tile per block: no hand-over.
      int t = first;
      for (int qi = 0; Traits::kPersistent || qi < 1; ++qi) {  // qi: Q buffers handed over
        // The next tile with rows (varlen: a sequence shorter than the longest has none past its
        // end; nobody computes those).
        TileCoord tc{};
        for (; t < num_tiles; t = next_tile(t)) {
          tc = tile_at(t);
          if (tc.m_block * kBlockM < SeqBounds(p, tc.b).nq) break;
        }
        const int buf = qi % kQBuf;
        if constexpr (Traits::kPersistent) {
          // The buffer's previous tile must be done with it (its epilogue reads Q too).
          if (qi >= kQBuf) ss.q_empty[buf].wait((qi / kQBuf - 1) & 1);
          ss.tile_of[buf] = t;
          ss.coord_of[buf] = make_int4(tc.m_block, tc.h, tc.b, 0);
          if (t >= num_tiles) {  // the end: handed over like a tile, by a plain arrive
            ss.barrier_q[buf].arrive();
            break;
          }
        } else if (t >= num_tiles) {
          break;
        }
        const SeqBounds seq(p, tc.b);
        int m0, m_end;
        tile_rows<kBlockM, kBlockN>(prm, tc.m_block, seq.nq, m0, m_end);
        const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
        int nb_min, nb_max;  // key tiles this query tile needs
        mask.key_blocks(m0, m_end, kBlockN, nb_min, nb_max);
        if (nb_max <= nb_min) {  // its rows see no key: the consumers write them without Q
          // (kOThroughV: o_free's phase of this tile waited for here too, though nothing of it
          // is loaded: a parity wait tells a phase from the one two before it only if no phase
          // is skipped)
          if constexpr (Traits::kOThroughV) ss.o_free.wait(qi & 1);
          if constexpr (Traits::kPersistent) ss.barrier_q[buf].arrive();
          t = next_tile(t);
          continue;
        }
        const int hk = prm.div_heads_per_kv.div(tc.h), bq = p.cu_seqlens_q ? 0 : tc.b;
        Tensor mQ = tma_rows(prm.tma_q, prm.rows_q, kHeadDim, p.heads, prm.batch_q,
                             seq.q_start + m0, tc.h, bq);  // (the tile's rows from m0)
        // The keys of this (sequence, kv head): K' or K (both descriptors live in parameter
        // space, with the same extents; each K copy below picks one by this flag, where a
        // reference to the chosen one held its 64-bit address across the key loop, one of the
        // producer thread's values on the stack at 24 registers).
        const bool centered = reads_centered_keys(p, tc.b, hk);
        Tensor mK = tma_rows(prm.tma_k, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
        Tensor mV = tma_rows(prm.tma_v, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
        Tensor sQ = q_buffer(buf);
        Tensor gQ = local_tile(mQ, select<0, 2>(typename Traits::TileShape{}), make_coord(_0{}, _0{}));
        Tensor gK = local_tile(mK, select<1, 2>(typename Traits::TileShape{}), make_coord(_, _0{}));
        Tensor gV = local_tile(mV, select<1, 2>(typename Traits::TileShape{}), make_coord(_, _0{}));
        auto [tQg, tQs] = tma_partition(prm.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(gQ));
        auto [tKg, tKs] = tma_partition(prm.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                        group_modes<0, 2>(gK));
        auto [tVg, tVs] = tma_partition(prm.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                        group_modes<0, 2>(gV));
        ss.barrier_q[buf].arrive_and_expect_tx(kBlockM * kHeadDim * int(sizeof(Element)));
        copy(prm.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q[buf]), 0), tQg, tQs);
        // The next tile is claimed below, once this one's loads are issued, i.e. about two key
        // tiles before its consumers finish it. Claimed as its loads began (until session 15's
        // last change), a tile waited behind a whole tile of its block while other blocks could
        // run out of work (scripts/sched_model.py --claim-ahead: the busiest block's work
        // 1.07-1.09x the mean at N = 4k-16k causal, against 1.04x).
        // K one tile ahead of V (K_top, K_top-1, V_top, K_top-2, V_top-1, ...), in the order
        // the consumers need them: V of tile n is consumed by the P.V GEMM issued after S of tile
        // n - 1, and its stage is freed a tile later than K's. Issued K, V, K, V, ..., the load
        // of K n - 2 waited behind the acquire of V n's stage: ~6% of the consumers' stall
        // samples were on the K and V barriers at d = 128 N = 2k (ncu, bench/NOTES.md session 13).
        // (The old order was GPROJ_FWD_AB bit 1 until session 15.)
        // (Not unrolled: the producer's thread has 24 registers, and the unrolled loop spilled.)
        constexpr int k_ahead = 1;
        // (kOThroughV: before the tile's first V load, the stores of every tile before it; a
        // flag rather than a compare with nb_max, one value fewer across the loop for the
        // producer thread's 24 registers)
        bool o_wait = Traits::kOThroughV;
#pragma unroll 1
        for (int nb = nb_max - 1 + k_ahead; nb >= nb_min; --nb) {
          const int nk = nb - k_ahead;  // this step's K tile, then V tile nb
          if (nk >= nb_min) {
            pipe_k.producer_acquire(wr_k);
            copy((centered ? prm.tma_kc : prm.tma_k).with(*pipe_k.producer_get_barrier(wr_k), 0),
                 tKg(_, nk), tKs(_, wr_k.index()));
            ++wr_k;
          }
          if (nb < nb_max) {
            // (kOThroughV: the previous tile's O staged in V's stages must have been stored)
            if (o_wait) {  // (false unless kOThroughV)
              ss.o_free.wait(qi & 1);
              o_wait = false;
            }
            pipe_v.producer_acquire(wr_v);
            copy(prm.tma_v.with(*pipe_v.producer_get_barrier(wr_v), 0), tVg(_, nb), tVs(_, wr_v.index()));
            ++wr_v;
          }
        }
        t = next_tile(t);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  const int consumer = wg - 1;
  typename Traits::TiledMmaQK mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);
  auto wg_qk = warpgroup_slice(mma_qk, consumer);  // shared-memory operands: warpgroup_slice
  auto wg_pv = warpgroup_slice(mma_pv, consumer);
  Tensor tSrK = wg_qk.partition_fragment_B(sK);
  Tensor tOrV = wg_pv.partition_fragment_B(sVt);
  Tensor tOrO = partition_fragment_C(mma_pv, select<0, 2>(typename Traits::TileShape{}));
  Tensor tScS = thr_qk.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShape{})));
  Tensor tOcO = thr_pv.partition_C(make_identity_tensor(select<0, 2>(typename Traits::TileShape{})));
  Tensor o_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
  Tensor oc_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
  Tensor sc_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(o_rc))::value;  // 2: rows lane/4 and lane/4 + 8
  const float c = p.softmax_scale * 1.4426950408889634f;
  // Epilogue: O, rounded to 16 bits, goes through this warpgroup's 64 rows of the Q buffer
  // (stmatrix), so that the global stores are whole 16-byte chunks of contiguous rows. Stored
  // straight from the accumulator, O was 2 x kHeadDim/2 four-byte stores per thread, each with
  // its own 64-bit address arithmetic: ~1000 instructions per thread and tile, 11% of the
  // kernel's warp samples at N = 2k (ncu, bench/NOTES.md "Forward v4").
  auto r2s_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
  auto r2s_o_thr = r2s_o.get_thread_slice(tid);
  // kPvFromSmem: P from the S accumulator layout into the P buffer.
  auto r2s_p = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_qk);
  auto r2s_p_thr = r2s_p.get_thread_slice(tid);
  RingCount<Traits::kStages, 0> rd_k, rd_v;  // continue across tiles, as the producer's do
  int tiles_with_keys = 0;    // (pingpong's opening and closing turns)
  // Persistent with two Q buffers: the thread that issued a tile's O store (TMA) waits for the
  // store's reads of the Q buffer only after the next tile's first S GEMM is issued, and arrives
  // on that buffer's q_empty then, not before it starts the next tile: its warp would hold the
  // warpgroup's first GEMM issue. The producer needs the buffer only for the tile after next.
  // Interleaved A/B (bench/NOTES.md session 32): -0.5 to -2% at N = 2k-4k. GPROJ_FWD_AB bit
  // 2048: the wait right after the store, as before. (One Q buffer: the next tile's Q waits for
  // this arrive, so the wait stays.)
  constexpr bool kCanDefer = Traits::kPersistent && kQBuf == 2;
  const bool defer_store_wait = kCanDefer && !(p.fwd_ab & 2048);
  int store_pending = -1;  // the buffer whose store is still being read, or -1
  auto flush_store = [&]() {
    if (kCanDefer && store_pending >= 0) {
      tma_store_wait<0>();
      ss.q_empty[store_pending].arrive();
      store_pending = -1;
    }
  };

  // (One tile per block: one iteration, visibly to the compiler: as a loop whose trip count it
  // could not bound, the d = 256 consumers spilled.)
  for (int qi = 0; Traits::kPersistent || qi < 1; ++qi) {  // qi: Q buffers taken over
    const int buf = qi % kQBuf;
    int t = first;
    if constexpr (Traits::kPersistent) {
      // The producer's next tile (or the end), handed over with its Q buffer. (Tiles without
      // keys come this way too, without a Q load.)
      ss.barrier_q[buf].wait((qi / kQBuf) & 1);
      t = ss.tile_of[buf];
      if (t >= num_tiles) {
        flush_store();
        break;
      }
    }
    TileCoord tc;
    if constexpr (Traits::kPersistent) {
      const int4 c4 = ss.coord_of[buf];
      tc = {c4.x, c4.y, c4.z};
    } else {
      tc = tile_at(t);
    }
    const int m_block = tc.m_block, h = tc.h, b = tc.b;
    const SeqBounds seq(p, b);
    int m0, m_end;  // the tile's rows
    tile_rows<kBlockM, kBlockN>(prm, m_block, seq.nq, m0, m_end);
    if (m0 >= seq.nq) continue;  // uniform for the block (one tile per block: a varlen tile past
                                 // its sequence; the persistent producer hands none over)
    const int hk = prm.div_heads_per_kv.div(h);
    const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
    int nb_min, nb_max;  // key tiles this query tile needs
    mask.key_blocks(m0, m_end, kBlockN, nb_min, nb_max);
    const bool has_keys = nb_max > nb_min;
    if (!has_keys) flush_store();  // (with keys: after the first S GEMM's issue)
    int full_lo, full_hi;  // key tiles in [full_lo, full_hi) need no mask (Mask::full_blocks)
    // Over the tile's rows only: the rows past them (padding past the sequence's end, or the next
    // tile's) are never stored, so a key tile that every row of the tile sees needs no mask. Counting them (GPROJ_FWD_AB
    // bit 512, the form before session 33), every key tile of a sequence's last, partial query
    // tile took the masked path: at d = 64 (192-row tiles, N = 2k) 16 of its 16 key tiles, ~150
    // more instructions each (ncu, bench/NOTES.md session 33). Padding rows see every key of a
    // full tile then: finite scores of zero (or another sequence's) rows, never stored.
    mask.full_blocks(m0, (p.fwd_ab & 512) ? kBlockM : m_end - m0, kBlockN, full_lo, full_hi);
    // (One Q buffer: its index as qi >> 30, zero, but not to ptxas, which then forms Q's GEMM
    // descriptors per tile instead of keeping them across the persistent loop: on the stack at
    // d = 256.)
    Tensor sQ = q_buffer(kQBuf == 1 ? qi >> 30 : buf);
    Tensor tSrQ = wg_qk.partition_fragment_A(sQ);
    const T* shift = p.k_shift ? reinterpret_cast<const T*>(p.k_shift) +
                                     (int64_t(b) * p.heads_k + hk) * kHeadDim
                               : nullptr;
    // Centered keys: the LSE of the user's scores gains alpha * (q . shift) per row. Computed
    // while the first S GEMM runs (it only reads Q, as the GEMM does), from 16-byte chunks:
    // lane l of a quad takes chunks l, l + 4, ... of its two rows.
    float qshift[kRows] = {};
    auto q_dot_shift = [&]() {
      constexpr int kChunks = kHeadDim / 8;
      static_assert(kRows == 2 && kChunks % 4 == 0, "rows lane / 4 and + 8, whole quads of chunks");
      // (rows row0 and row0 + 8, 1024 bytes apart; their chunks by Traits::q_chunk_addr)
      const uint32_t a0 = smem_addr(&sQ(get<0>(oc_rc(0, 0)), (tid & 3) * 8));
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float acc = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kChunks / 4; ++j)
          acc = dot8_accumulate<T>(ld_shared_v4_at(Traits::q_chunk_addr(a0 + 1024 * r, j)),
                                   *reinterpret_cast<const uint4*>(shift + ((tid & 3) + 4 * j) * 8),
                                   acc);
        qshift[r] = quad_sum(acc);
      }
    };
    clear(tOrO);
    float row_max[kRows], row_sum[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.f;
    // S of tile nb: issue the GEMM (asynchronous); the caller waits.
    auto issue_s = [&](auto& tSrS, auto const& st, bool waited = false) {
      if (!waited) pipe_k.consumer_wait(st);
      wg_gemm<true>(mma_qk, tSrQ, tSrK(_, _, _, st.index()), tSrS);
    };
    // Mask + online softmax of one S tile, in place (S <- p); returns nothing, records in
    // `rescale` the factor the O accumulator must be multiplied by before the next P.V.
    float rescale[kRows];
    auto softmax = [&](auto& tSrS, int nb, auto&& mid) {
      const int n0 = nb * kBlockN;
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      if (nb >= full_hi || nb < full_lo) {  // (mask.tile_partial)
        // Per row, the visible keys as one range (Mask::row_columns). Without a left bound
        // (causal, or a window to the right only) lo is INT_MIN: the upper bound alone, one
        // compare per score instead of two (FlashAttention-3's causal mask): ~64 fewer
        // instructions per masked tile and thread (bench/NOTES.md session 16).
        auto keys = [&](int row, int col0, int& lo, int& hi) {
          mask.row_columns(m0 + row, n0 + col0, lo, hi);
        };
        if (mask.left < 0) {
          mask_row_ranges<false, true>(s_rc, sc_rc, keys, -INFINITY);
        } else {
          mask_row_ranges<true, true>(s_rc, sc_rc, keys, -INFINITY);
        }
      }
      constexpr int kCols = decltype(size<1>(s_rc))::value;
      float m_use[kRows], sum[kRows];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        // Row max in four independent chains (max is exact, so the order does not matter): a
        // single chain is kBlockN/4 dependent FMNMX on the path from S to the first exp2. The
        // chains start from the row's first four scores, one of them with the running max
        // folded in (the same in the quad's four lanes), not from -inf: 34 FMNMX per row of 128
        // keys instead of 38 (session 16; FlashAttention-3's count).
        static_assert(kCols >= 4, "four max chains");
        float mx4[4] = {fmaxf(row_max[r], s_rc(r, 0)), s_rc(r, 1), s_rc(r, 2), s_rc(r, 3)};
        CUTLASS_PRAGMA_UNROLL
        for (int j = 4; j < kCols; ++j) mx4[j % 4] = fmaxf(mx4[j % 4], s_rc(r, j));
        const float mx = fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3]));
        const float m_new = quad_max(mx);
        m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // row sees no key yet: p = 0
        rescale[r] = exp2_approx((row_max[r] - m_use[r]) * c);
        row_max[r] = m_new;
        sum[r] = 0.f;
      }
      // The exponentials in row-major order; `mid` gets the value of the kPvWaitAfter-th
      // (FwdTraits::kPvWaitInSoftmax), the row sums keep their order either way.
      auto exp_range = [&](int lo, int hi) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < kCols; ++j) {
            if (r * kCols + j < lo || r * kCols + j >= hi) continue;
            float x;
            if constexpr (kGProj) {
              x = exp2_approx((s_rc(r, j) - m_use[r]) * c);       // exact max: exp2(0) = 1
            } else {
              x = exp2_approx(fmaf(s_rc(r, j), c, -(m_use[r] * c)));  // FA3's fused form
            }
            s_rc(r, j) = x;
            sum[r] += x;
          }
        }
      };
      // Which exponential anchors the P.V wait: chosen from the SASS, where ptxas's order of the
      // MUFUs, not the source's, decides. At d = 128 the 10th puts the wait after 18 of 66 MUFU in
      // fa3 mode, the 33rd after 13 in gproj mode; measured best of the places tried (fa3 mode
      // 16-55 MUFU, gproj 8-55; bench/NOTES.md session 31), FlashAttention-3's is 19.
      constexpr int kPvWaitAfter = kGProj ? 33 : 10;
      constexpr int kSplit = Traits::kPvWaitInSoftmax ? kPvWaitAfter : kRows * kCols;
      static_assert(kSplit >= 1 && kSplit <= kRows * kCols, "the P.V wait's place in the softmax");
      exp_range(0, kSplit);
      mid(s_rc((kSplit - 1) / kCols, (kSplit - 1) % kCols));
      exp_range(kSplit, kRows * kCols);
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) row_sum[r] = row_sum[r] * rescale[r] + sum[r];
    };
    // O *= rescale once P.V is done. Skipped when no row of the warp changed its max: multiplying
    // by 1 is exact, and on long rows the max settles early. (FlashAttention-3's order, the
    // rescale between the next S GEMM's issue and P.V's, measured 3-15% slower here: v4 in
    // bench/NOTES.md.)
    auto rescale_o = [&]() {
      bool any = false;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) any |= rescale[r] != 1.f;
      if (!Traits::kSkipRescale || __any_sync(0xffffffffu, any)) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r)
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(o_rc); ++j) o_rc(r, j) *= rescale[r];
      }
    };
    // P rounded once into the A operand of the PV GEMM: registers, or (kPvFromSmem) this
    // warpgroup's rows of the P buffer, visible to the tensor cores (async proxy) and written by
    // all four warps before the GEMM is issued.
    auto to_p = [&](auto const& tSrS, auto& tOrP) {
      if constexpr (Traits::kPvFromSmem) {
        // Rounded and stored one stmatrix column block at a time, so that S's registers die as
        // P leaves.
        // The buffer's address passes through an empty asm, so that the compiler recomputes the
        // twelve swizzled stmatrix addresses here instead of keeping them live across the loop
        // (hoisted, they spilled 100 bytes at 160 registers).
        Element* p_base = ss.p_tiles.p.data();
        asm volatile("" : "+l"(p_base));
        Tensor src = r2s_p_thr.retile_S(tOrP);
        Tensor src_f = r2s_p_thr.retile_S(tSrS);
        Tensor dst = r2s_p_thr.partition_D(
            make_tensor(make_smem_ptr(p_base), typename Traits::SmemLayoutP{}));
        CUTLASS_PRAGMA_UNROLL
        for (int n = 0; n < size<2>(src); ++n) {
          CUTLASS_PRAGMA_UNROLL
          for (int m = 0; m < size<1>(src); ++m) {
            CUTLASS_PRAGMA_UNROLL
            for (int v = 0; v < size<0>(src); ++v) src(v, m, n) = static_cast<Element>(src_f(v, m, n));
          }
          copy(r2s_p, src(_, _, n), dst(_, _, n));
        }
        cutlass::arch::fence_view_async_shared();
        wg_sync(consumer);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(tSrS); ++i) tOrP(i) = static_cast<Element>(tSrS(i));
      }
    };

    if (has_keys) {
      if constexpr (!Traits::kPersistent) ss.barrier_q[buf].wait(0);
      Tensor tSrS = partition_fragment_C(mma_qk, select<0, 1>(typename Traits::TileShape{}));
      Tensor tOrP = make_tensor_like<Element>(tSrS);
      // The PV GEMM's A operand: P's registers, or its shared-memory descriptors.
      auto tOrPa = [&] {
        if constexpr (Traits::kPvFromSmem) {
          return wg_pv.partition_fragment_A(
              make_tensor(make_smem_ptr(ss.p_tiles.p.data()), typename Traits::SmemLayoutP{}));
        } else {
          return make_tensor(tOrP.data(), acc_to_a_layout(tSrS.layout()));
        }
      }();
      // Pingpong: consumer 0 takes the first turn (the last consumer's opening pass); every turn
      // below is a wait/pass pair, the same number in every warpgroup (same key tiles), and
      // consumer 0's extra wait at the end consumes the last consumer's last pass, so no barrier
      // is left half-arrived. A warpgroup passes again only after the round robin has come back
      // to it, i.e. after the next one's wait: no barrier is arrived at twice before its bar.sync.
      // Persistent: the opening pass happens on the block's first tile only; on later tiles
      // consumer 0's first wait takes the last consumer's last pass of the previous tile.
      if constexpr (Traits::kPingpong) {
        if (consumer == kWGs - 1 && tiles_with_keys == 0) turn_pass<kWGs>(consumer);
        turn_wait(consumer);
      }
      issue_s(tSrS, rd_k);
      flush_store();
      if constexpr (Traits::kPingpong) turn_pass<kWGs>(consumer);
      // Not where the lazy pre-pass found this (sequence, kv head)'s shift zero in every
      // coordinate (keys_shifted): q . shift is zero there. Skipping it saves the per-tile dot
      // products and the shift's global loads, ~4% of the gproj forward's warp samples at
      // d = 128 N = 4k causal (ncu, bench/NOTES.md session 18). Output and LSE are unchanged.
      if (shift != nullptr && keys_shifted(p, b, hk)) q_dot_shift();
      warpgroup_wait<0>();
      // kOThroughV: Q's last reader was this tile's last S GEMM (q . shift ran before it ended)
      if constexpr (Traits::kOThroughV) {
        if (nb_max - 2 < nb_min) ss.q_empty[buf].arrive();
      }
      pipe_k.consumer_release(rd_k);
      ++rd_k;
      softmax(tSrS, nb_max - 1, [](float) {});
      // Steady state: S of tile nb and P.V of tile nb + 1 in flight together; the softmax of
      // tile nb runs while the tensor cores finish P.V (intra-warpgroup overlap). With
      // kPvWaitAtTop, P.V is waited for at the top of the next iteration (finish_pv), so that the
      // wait and the softmax are in different basic blocks: written as wait-after-softmax in one
      // block, ptxas hoists the wait (WARPGROUP.DEPBAR) above the softmax, and the two run one
      // after the other (SASS and ncu, bench/NOTES.md session 9).
      // pv_in_flight: false before the first P.V (nothing to wait for, no V stage to release,
      // O still zero).
      auto finish_pv = [&](bool pv_in_flight) {
        warpgroup_wait<0>();  // P.V done: P may be overwritten, V released
        if (pv_in_flight) {
          pipe_v.consumer_release(rd_v);
          ++rd_v;
          rescale_o();
        }
        to_p(tSrS, tOrP);
      };
      if constexpr (!Traits::kPvWaitAtTop) to_p(tSrS, tOrP);
      for (int nb = nb_max - 2; nb >= nb_min; --nb) {
        if constexpr (Traits::kPvWaitAtTop) finish_pv(nb < nb_max - 2);
        if constexpr (Traits::kKWaitFirst) pipe_k.consumer_wait(rd_k);
        if constexpr (Traits::kPingpong) turn_wait(consumer);
        issue_s(tSrS, rd_k, Traits::kKWaitFirst);
        pipe_v.consumer_wait(rd_v);
        wg_gemm<false>(mma_pv, tOrPa, tOrV(_, _, _, rd_v.index()), tOrO);
        if constexpr (Traits::kPingpong) turn_pass<kWGs>(consumer);
        warpgroup_wait<1>();  // S done (P.V may still run)
        if constexpr (Traits::kOThroughV) {
          if (nb == nb_min) ss.q_empty[buf].arrive();  // (the tile's last S: Q is dead)
        }
        if constexpr (Traits::kPvWaitInSoftmax) {
          // P.V waited for inside the softmax (FwdTraits::kPvWaitInSoftmax): the K stage's release
          // is predicated on an exponential's value (true for any exp2 result, NaN included),
          // which keeps it, and the wait that ptxas keeps after it, below that exponential.
          softmax(tSrS, nb, [&](float x) {
            mbarrier_arrive_if(&ss.pipe_k.empty_barrier_[rd_k.index()], !(x < 0.f));
            ++rd_k;
            warpgroup_wait<0>();
            pipe_v.consumer_release(rd_v);
            ++rd_v;
          });
          to_p(tSrS, tOrP);
          rescale_o();
        } else {
          pipe_k.consumer_release(rd_k);
          ++rd_k;
          softmax(tSrS, nb, [](float) {});
          if constexpr (!Traits::kPvWaitAtTop) finish_pv(true);
        }
      }
      if constexpr (Traits::kPvWaitAtTop) finish_pv(nb_max - 2 >= nb_min);
      if constexpr (Traits::kPingpong) turn_wait(consumer);
      pipe_v.consumer_wait(rd_v);
      wg_gemm<false>(mma_pv, tOrPa, tOrV(_, _, _, rd_v.index()), tOrO);
      if constexpr (Traits::kPingpong) {
        turn_pass<kWGs>(consumer);
        // Persistent: consumer 0's closing wait moves after the tile loop (consumer 1 would
        // otherwise pass twice, this pass and the next tile's opening one, possibly before it).
        if (consumer == 0 && !Traits::kPersistent) turn_wait(consumer);
      }
      warpgroup_wait<0>();
      pipe_v.consumer_release(rd_v);
      // Persistent: rd_v continues into the next tile like the producer's state, which advanced
      // past this last V tile too. Without it the next tile waits on (and releases) this stage
      // again, one V behind the producer: a wait on a parity that has already flipped twice, and
      // the hang on every block's second tile. (One tile per block: rd_v is dead here.)
      if constexpr (Traits::kPersistent) ++rd_v;
    }

    // ---------------- epilogue: normalize, store O, LSE and the softmax state ----------------
    const int64_t o_off = b * p.o_stride[0] + int64_t(seq.q_start + m0) * p.o_stride[1] +
                          h * p.o_stride[2];
    T* gO = reinterpret_cast<T*>(p.out) + o_off;
    float inv[kRows];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float l = quad_sum(row_sum[r]);
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      const int row = get<0>(oc_rc(r, 0));
      if ((tid & 3) == 0 && m0 + row < m_end) {
        const int64_t idx = rowstat_index(p, b, h, seq.q_start + m0 + row);
        const bool empty = row_max[r] == -INFINITY;
        const float log2l = empty ? 0.f : log2f(l);
        const float m_raw = empty ? INFINITY : row_max[r];
        reinterpret_cast<float2*>(p.stats)[idx] = make_float2(m_raw, log2l);
        reinterpret_cast<float*>(p.lse)[idx] =
            empty ? INFINITY : (m_raw * c + log2l) * 0.6931471805599453f + p.softmax_scale * qshift[r];
      }
    }
    // O's staging buffer, laid out as Q: this warpgroup's rows of the Q buffer, whose last S GEMM
    // was waited on; kOThroughV the V stages, once both warpgroups' last P.V GEMMs are done.
    Tensor sO = [&] {
      if constexpr (Traits::kOThroughV) {
        return make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutQ{});
      } else {
        return sQ;
      }
    }();
    if (has_keys && prm.o_vec) {
      Tensor tOrOe = make_tensor_like<Element>(tOrO);
      Tensor oe_rc = make_tensor(tOrOe.data(), acc_rowcol(tOrOe.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(o_rc); ++j) oe_rc(r, j) = static_cast<Element>(o_rc(r, j) * inv[r]);
      if constexpr (Traits::kOThroughV) {
        static_assert(kWGs == 2, "kOThroughV: both consumer warpgroups on named barrier 10");
        consumers_sync();  // the other warpgroup's last P.V may still read the stages
      }
      copy(r2s_o, r2s_o_thr.retile_S(tOrOe), r2s_o_thr.partition_D(sO));
      // TMA stores where they cannot write past this sequence's rows: its tensor ends with the
      // sequence (one per batch entry), or the tile is whole (varlen packs the next sequence
      // right after). Stored by the threads instead (below), each row took ~26 instructions of
      // swizzled 64-bit address arithmetic: 434 instructions per thread and tile, 8% of the
      // kernel's at d = 128 N = 2k (ncu, bench/NOTES.md session 13).
      // (Not the shifted first tile of a dense batch either: its store would cover the next
      // tile's rows.)
      if (prm.o_tma && (m0 + kBlockM <= m_end || (p.cu_seqlens_q == 0 && m_end == seq.nq))) {
        cutlass::arch::fence_view_async_shared();  // stmatrix writes -> the TMA engine's reads
        wg_sync(consumer);
        if ((tid & 127) == 0) {
          const int bq = p.cu_seqlens_q ? 0 : b;
          // (the warpgroup read afresh, fresh_thread_index: derived from `consumer`, formed
          // before the persistent loop, the store's row and shared address were kept across it,
          // on the stack at d = 256)
          const int cw = fresh_thread_index() / 128 - 1;
          Tensor mO = tma_rows(prm.tma_o, prm.rows_q, kHeadDim, p.heads, prm.batch_q,
                               seq.q_start + m0, h, bq);
          Tensor gO = local_tile(mO, Shape<_64, _64>{}, make_coord(cw, _));
          CUTLASS_PRAGMA_UNROLL
          for (int cb = 0; cb < kHeadDim / 64; ++cb) {
            Tensor sOb = make_tensor(make_smem_ptr(sO.data() + (cw * 64 + cb * kBlockM) * 64),
                                     typename Traits::SmemLayoutOBlock{});
            auto [tOg, tOs] = tma_partition(prm.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sOb),
                                            group_modes<0, 2>(gO(_, _, cb)));
            copy(prm.tma_o, tOs, tOg);
          }
          tma_store_arrive();
          // The Q buffer (its next load, persistent) or the block's shared memory (its exit)
          // must outlive the stores' reads of it.
          if (defer_store_wait) {
            store_pending = buf;
          } else {
            tma_store_wait<0>();
            if constexpr (Traits::kOThroughV) ss.o_free.arrive();  // V's stages read: the producer's
          }
        }
      } else {
        wg_sync(consumer);
        constexpr int kChunks = Traits::kOChunks, kRowStep = Traits::kORowStep;
        const int wtid = tid & 127, col = (wtid % kChunks) * 8;
        const int row0 = consumer * 64 + wtid / kChunks;
        const uint32_t a0 = smem_addr(&sO(row0, col));  // (the rest by Traits::o_row_addr)
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 64 / kRowStep; ++i) {
          const int row = row0 + kRowStep * i;
          if (m0 + row < m_end)
            st_global_v4(gO + int64_t(row) * p.o_stride[1] + col,
                         ld_shared_v4_at(Traits::o_row_addr(a0, i)));
        }
        // Persistent: the producer's next TMA load of Q (kOThroughV: of V) into this buffer is an
        // async-proxy write after these generic-proxy accesses.
        if constexpr (Traits::kPersistent) cutlass::arch::fence_view_async_shared();
        if constexpr (Traits::kOThroughV) {
          wg_sync(consumer);  // every thread's reads of the stages done
          if ((tid & 127) == 0) ss.o_free.arrive();
        }
      }
    } else {
      // Rows without keys (Q never loaded; one tile per block: the buffer was never filled),
      // an fp32 output (context parallelism merges chunks) or unaligned strides: direct stores.
      float* gOf = p.out_f32 ? reinterpret_cast<float*>(p.out_f32) + o_off : nullptr;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(oc_rc(r, 0));
        if (m0 + row >= m_end) continue;
        const int64_t orow = int64_t(row) * p.o_stride[1];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(o_rc); j += 2) {
          const int col = get<1>(oc_rc(r, j));
          const float o0 = o_rc(r, j) * inv[r], o1 = o_rc(r, j + 1) * inv[r];
          if (gOf) {
            *reinterpret_cast<float2*>(gOf + orow + col) = make_float2(o0, o1);
          } else {
            *reinterpret_cast<uint32_t*>(gO + orow + col) = pack2<T>(o0, o1);
          }
        }
      }
      // (kOThroughV: nothing staged, but o_free counts every tile)
      if constexpr (Traits::kOThroughV) {
        if ((tid & 127) == 0) ss.o_free.arrive();
      }
    }

    // Q (GEMMs, q . shift, the O staging) no longer needed: the buffer goes back to the producer
    // (every tile handed over, with keys or not; kOThroughV: a tile with keys gave it back after
    // its last S GEMM).
    if constexpr (Traits::kOThroughV) {
      if (!has_keys) ss.q_empty[buf].arrive();
    } else if constexpr (Traits::kPersistent) {
      if (store_pending != buf) ss.q_empty[buf].arrive();  // (else after its store's reads)
    }
    if (has_keys) ++tiles_with_keys;
  }
  // Persistent pingpong: consumer 0 takes consumer 1's last pass, so no barrier is left
  // half-arrived (tiles_with_keys is the same in every warpgroup).
  if constexpr (Traits::kPersistent && Traits::kPingpong) {
    if (consumer == 0 && tiles_with_keys > 0) turn_wait(consumer);
  }
#endif
}

// Tile shapes and schedules. Variant 0 is the measured default (see run_forward); the others
// are selected with GPROJ_FWD_VARIANT for A/B runs (bench/NOTES.md):
//   1 no pingpong, 2 the default with the opposite O-rescale skipping (FwdTraits),
//   3 persistence flipped (the default is persistent at d = 64 and 128; at d = 128 variant 3
//   is also the default under a mask beyond N = 8k, forward_impl), 4 persistent + kBlockN 176
//   at d=128 and persistent with three consumer warpgroups (192-row query tiles) at d=64, 5
//   three consumer warpgroups (192-row query tiles) at d=64, 6 three consumer
//   warpgroups on 192 x 192 tiles with P through shared memory at d=64 (FlashAttention-3's
//   d = 64 non-causal shape) and 80-key tiles at d = 256 (FlashAttention-3's d = 256 tile, 224 KB
//   of shared memory; measured 4-8% faster than 64 keys from N = 2k in session 15, the
//   default there on dense batches since session 16, forward_impl), 7 the same with 160-key
//   tiles at d = 64, 9 176-key tiles at d=128 without persistence (0 B spill, where the
//   persistent variant 4 spills 48 B; FlashAttention-3's d = 128 non-causal tile; since
//   session 13 fa3 mode's default without a mask from N = 8k, since session 31 both modes'
//   under a mask beyond 8k, forward_impl), and at d = 64 variant 4 with P.V waited for at the top of the next iteration
//   (the softmax overlapping P.V inside a warpgroup, as at d >= 128).
// At d = 256 (session 36) variant 7 is variant 6's 80-key kernel persistent with O staged in the V
// stages (FwdTraits::kOThroughV) and without pingpong, the default at every length since then
// (forward_impl); variant 12 the same with pingpong (A/B).
// Since session 31 P.V is waited for inside the softmax (FwdTraits::kPvWaitInSoftmax) in every
// d = 128 variant and in the kernels the default runs from N = 2k at d = 64 and 256 (variants 9,
// 6 and their variant 10); variant 11 is that kernel (d = 64 variant 9's, d = 128 variant 0's,
// d = 256 variant 6's) with the wait at the top of the next iteration, the form before. Since
// session 32 also in d = 64's two-warpgroup kernels (variants 0-3 and 8; fa3 mode -2 to -6% at
// N = 1k-2k, gproj 0 to -1%); variant 12 is variant 0 with the wait after the softmax, as before.
template <int kHeadDim, int kVariant> struct FwdTiles;
// Variant 10 is the other order of the K wait and the pingpong turn (FwdTraits::kKWaitFirst:
// after the turn at d = 64 and 128, before it at d = 256) on the kernel the default runs from
// N = 2k: d = 64 variant 9's, d = 128 variant 0's, d = 256 variant 6's.
template <int V> struct FwdTiles<64, V> {
  static constexpr int kBlockN = V == 6 ? 192 : V == 7 ? 160 : 128, kStages = 2;
  static constexpr int kMmaWarpGroups = (V >= 4 && V <= 7) || (V >= 9 && V <= 11) ? 3 : 2;
  static constexpr bool kPvFromSmem = V == 6 || V == 7;
  // variant 9: variant 4 with P.V waited for inside the softmax (at the top of the next
  // iteration from session 15 to 30: variant 11)
  // variant 12: variant 0's two warpgroups with P.V waited for after the softmax, where ptxas
  // hoists the wait above it (the form before session 32)
  static constexpr bool kPvWaitInSoftmax = !(V >= 4 && V <= 7) && V != 11 && V != 12;
  static constexpr bool kPvWaitAtTop = V == 11;
  static constexpr bool kKWaitFirst = V != 10;
};
template <int V> struct FwdTiles<128, V> {
  static constexpr int kBlockN = V == 4 || V == 9 ? 176 : 128, kStages = 2, kMmaWarpGroups = 2;
  static constexpr bool kPvFromSmem = false, kPvWaitAtTop = V == 11, kKWaitFirst = V != 10;
  static constexpr bool kPvWaitInSoftmax = V != 11;
};
template <int V> struct FwdTiles<256, V> {
  static constexpr int kBlockN = V == 6 || V == 7 || V >= 10 ? 80 : 64, kStages = 2, kMmaWarpGroups = 2;
  static constexpr bool kPvWaitInSoftmax = V == 6 || V == 7 || V == 10 || V == 12;
  static constexpr bool kPvFromSmem = false, kPvWaitAtTop = !kPvWaitInSoftmax, kKWaitFirst = V == 10;
};

// The kernel of forward variant kVariant at head dim kHeadDim (run_forward's; the host checks in
// tests/host/ instantiate it too).
template <typename T, int kHeadDim, int kVariant>
struct FwdVariant {
  using Tiles = FwdTiles<kHeadDim, kVariant>;
  // Pingpong at every head dim (variant 1: none). At d = 128 and 256 it measured up to +15% at
  // N = 4k-8k (bench/NOTES.md, "sm90 forward variants"); at d = 64 neutral in fa3 mode and
  // +5-15% in gproj mode, whose softmax has one more FP32 instruction per score (v4).
  // (d = 256 variant 7: variant 12 without it, FlashAttention-3's d = 256 configuration: no
  // scheduler barrier between its warpgroups at head dims above 128)
  static constexpr bool kPingpong = kVariant != 1 && !(kHeadDim == 256 && kVariant == 7);
  // O-rescale skipping (FwdTraits::kSkipRescale): with the P.V wait inside the softmax the
  // rescale's FMULs trail the exp2 stream (ptxas puts them after the last MUFU whatever the
  // source order), and skipping them where no row max of the warp moved measured faster at
  // d = 128 (fa3 mode 8k -2.2%, 16k -4.8%, gproj 0 to -0.7%) and at d = 256 (0 to -1.2%), not at
  // d = 64 (gproj 2k +1.5%; bench/NOTES.md session 31); otherwise only without pingpong (v4).
  // Variant 2 flips it.
  static constexpr bool kSkipByDefault = Tiles::kPvWaitInSoftmax ? kHeadDim != 64 : !kPingpong;
  static constexpr bool kSkipRescale = (kVariant == 2) != kSkipByDefault;
  // Persistent at d = 64 and 128 (variant 3 flips it): at d = 64 it measured +3-7% in gproj
  // mode and -4 to +1% in fa3 mode (bench/NOTES.md v4); at d = 256 -4%. At d = 128 neutral
  // until session 13, when the O store by TMA and K loaded a tile ahead made it 1-5% faster
  // except under a causal mask at long N (16k: +17-19%; not the static round robin of tiles
  // over blocks: dealing waves in alternating directions changed nothing, bench/NOTES.md
  // session 13 item 7): forward_impl takes variant 3 there, beyond N = 8k. (Variants 5-7, three
  // consumer warpgroups, stay non-persistent: the form that was measured; variant 5 is the
  // d = 64 default at long N, see forward_impl.) At d = 256 variants 7 (the default since
  // session 36) and 12 are persistent with O staged in the V stages (FwdTraits::kOThroughV).
  static constexpr bool kPersistent = kVariant == 4 ||
                                      (kHeadDim == 64 && kVariant >= 9) ||
                                      (kHeadDim == 128 && kVariant >= 10) ||
                                      (kHeadDim == 256 && (kVariant == 7 || kVariant == 12)) ||
                                      (kVariant < 5 && ((kVariant == 3) != (kHeadDim != 256)));
  using Traits = FwdTraits<T, kHeadDim, Tiles::kBlockN, Tiles::kStages, kPingpong, kPersistent,
                           kSkipRescale, Tiles::kMmaWarpGroups, Tiles::kPvFromSmem,
                           Tiles::kPvWaitAtTop, Tiles::kKWaitFirst, Tiles::kPvWaitInSoftmax>;
};

template <typename T, int kHeadDim, bool kGProj, int kVariant = 0>
void run_forward(const AttnParams& p, int total_q, int total_k) {
  using Traits = typename FwdVariant<T, kHeadDim, kVariant>::Traits;
  const bool varlen = p.cu_seqlens_q != 0;
  FwdKernelParams<Traits> prm;
  set_tma_extents(prm, p, total_q, total_k);
  prm.tma_q = make_tma_q<Traits>(p.q, prm.rows_q, p.heads, prm.batch_q, p.q_stride, varlen);
  prm.tma_k = make_tma_kv<Traits>(p.k, prm.rows_k, p.heads_k, prm.batch_q, p.k_stride, varlen);
  prm.tma_kc = p.k_centered ? make_tma_kv<Traits>(p.k_centered, prm.rows_k, p.heads_k, prm.batch_q,
                                                  p.kc_stride, varlen)
                            : prm.tma_k;
  prm.tma_v = make_tma_kv<Traits>(p.v, prm.rows_k, p.heads_k, prm.batch_q, p.v_stride, varlen);
  prm.o_vec = p.out_f32 == 0 && p.out % 16 == 0 && p.o_stride[0] % 8 == 0 &&
              p.o_stride[1] % 8 == 0 && p.o_stride[2] % 8 == 0;
  prm.o_tma = prm.o_vec && !(p.fwd_ab & 2);
  if (prm.o_tma) {
    const auto mo = tma_gmem<typename Traits::Element>(p.out, prm.rows_q, kHeadDim, p.heads,
                                                       prm.batch_q, p.o_stride, varlen);
    prm.tma_o = make_tma_copy(SM90_TMA_STORE{},
                              make_tensor(make_gmem_ptr(const_cast<typename Traits::Element*>(mo.data().get())),
                                          mo.layout()),
                              typename Traits::SmemLayoutOBlock{}, Shape<_64, _64>{}, _1{});
  }
  auto kernel = fwd_sm90_kernel<Traits, kGProj>;
  const int smem = Traits::kSmemBytes;
  prm.num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (prm.num_m_blocks == 0) return;
  // Under a causal-like mask (GPROJ_FWD_AB bit 256: not) each sequence's partial query tile is
  // its first (partial_first). At d = 64's 192-row tiles and N = 2k causal the last tile (rows
  // 1920-2047 and 64 padding rows) needed all 16 key tiles; first (rows 0-127) it needs one:
  // the (sequence, head)'s 11 tiles take 96 key tiles instead of 101. (A first form with the
  // tile's rows before 0, i.e. TMA boxes at negative rows, crashed with an illegal instruction on
  // the H200: bench/NOTES.md session 33.) Where kBlockN divides kBlockM, by a multiple of
  // kBlockN only (tile_rows): a tile that ends s < kBlockN rows earlier needs the same key tiles,
  // and its diagonal, moved off the key tiles' edges, crosses two of them instead of one (one
  // more masked iteration per tile), measured so with the whole shift at 128 x 128 tiles
  // (session 33 item 6, varlen mean length 2k causal: d = 64 +2%, d = 128 +1.3%).
  prm.partial_first = p.window_right >= 0 && !(p.fwd_ab & 256);
  dim3 grid;
  int64_t sched_tiles = 0;  // persistent: the schedule's tiles
  prm.sched_group = 1;
  prm.tile_counter = nullptr;
  prm.ragged_first = p.tile_order != 3;
  // What one (sequence, head) pair streams: its K and V (the schedules' group size, tile.cuh).
  const int64_t kv_bytes = 2 * int64_t(std::max(p.seqlen_k, 1)) * kHeadDim * int64_t(sizeof(T));
  if constexpr (Traits::kPersistent) {  // (the dispatcher's device properties, launch.cu)
    if (p.num_sms <= 0 || p.l2_bytes <= 0)
      throw std::logic_error("persistent sm90 forward: num_sms / l2_bytes unset (launch.cu sets them)");
    // Varlen: the one-tile grid's slots (decode_slot), unless GPROJ_FWD_AB bit 4 asks for every
    // sequence as long as the longest (the schedule before session 35).
    dim3 slots;
    const bool by_slot = slot_grid(prm.p, Traits::kBlockM, total_q, p.heads, slots);
    const int64_t tiles = by_slot ? int64_t(slots.x) : int64_t(prm.num_m_blocks) * p.heads * p.batch;
    sched_tiles = tiles;
    grid = dim3(unsigned(std::min<int64_t>(tiles, p.num_sms)), 1, 1);
    // Under a mask, groups of (sequence, head) pairs scheduled together, their K and V within
    // half of L2, each group's longest tiles first across its pairs (GPROJ_FWD_AB bit 16: one
    // pair at a time, measured slower). Without a mask every tile is as long as the next: one
    // pair at a time, its query tiles on consecutive blocks (FlashAttention-3's order), so that
    // the ~8 pairs in flight have their K and V read from DRAM about once, by the first of their
    // 16 tiles (N = 2k, d = 128), and the rest hit in L2. Grouped there (GPROJ_FWD_AB bit 1024,
    // the order before session 34), a pair's tiles spread over waves, and between two waves the
    // streamed Q and O evict much of K and V: ncu at d = 128 N = 2k read 630 MB from DRAM per
    // call against FlashAttention-3's 259 (Q, K, V, O: 256 MB), and in a power-capped run that
    // traffic is clock (bench/NOTES.md session 34).
    const bool masked = p.masked();
    const bool grouped = masked ? !(p.fwd_ab & 16) : (p.fwd_ab & 1024) != 0;
    prm.sched_group = grouped ? l2_pair_group(p, kv_bytes, p.heads * p.batch) : 1;
    // Under a mask, and in a varlen batch (its sequences differ in length), the tiles differ in
    // length: handed out by a counter (zeroed here, in the launch's stream, so CUDA graphs
    // capture it as a memset node; in gproj mode with the centering workspace,
    // tile_counter_zeroed), unless the caller gave no scratch for it or GPROJ_FWD_AB bit 8 asks
    // for the round robin.
    if ((masked || by_slot) && p.tile_counter != 0 && !(p.fwd_ab & 8) && int64_t(grid.x) < tiles) {
      prm.tile_counter = reinterpret_cast<int*>(p.tile_counter);
      if (!p.tile_counter_zeroed || (p.fwd_ab & 128))  // (gproj: zeroed with the centering workspace)
        check_cuda(cudaMemsetAsync(prm.tile_counter, 0, sizeof(int),
                                   reinterpret_cast<cudaStream_t>(p.stream)),
                   "forward (sm90): zeroing the tile counter");
    }
  } else if (!slot_grid(prm.p, Traits::kBlockM, total_q, p.heads, grid)) {
    grid = tile_grid(prm.p, prm.num_m_blocks, p.heads, p.batch, kv_bytes);
  }
  {
    const int pairs = p.heads * p.batch, G = prm.sched_group;
    prm.num_tiles = Traits::kPersistent && prm.p.slot_rows ? int(sched_tiles) : prm.num_m_blocks * pairs;
    prm.last_group = (pairs - 1) / G;
    prm.div_group_tiles = cutlass::FastDivmod(G * prm.num_m_blocks);
    prm.div_group = cutlass::FastDivmod(G);
    prm.div_last_group = cutlass::FastDivmod(pairs - (pairs - 1) / G * G);
    prm.div_heads = cutlass::FastDivmod(p.heads);
    prm.div_heads_per_kv = cutlass::FastDivmod(p.heads / p.heads_k);
  }
  // gproj at d = 64 and 128: the programmatic dependent of the centering pass's second kernel
  // (the call's kernel before it, ops.forward_cuda), so that its start-up runs under that pass
  // (bench/NOTES.md session 30: 4-7 us less between the pre-pass and the forward at N = 2k-4k,
  // -0.3 to -1.1% of the call interleaved). At d = 256 the same launch measured 1-2% slower in
  // two interleaved runs (the timeline read it faster; not understood), and fa3 mode has no
  // pre-pass to hide under (it measured no faster): both keep the plain launch.
  launch_sm90(kernel, grid, Traits::kNumThreads, smem, prm, p, "forward (sm90)",
              /*programmatic=*/kGProj && (kHeadDim != 256 || (p.fwd_ab & 4096)) &&
                  !(p.fwd_ab & 128));
}

}  // namespace sm90
}  // namespace gproj
