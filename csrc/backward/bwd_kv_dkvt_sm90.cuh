// The Hopper (sm_90a) KV-outer backward pass of fa3 mode at head dim 256 on FlashAttention-3's
// partition: 80-key blocks, dK and dV computed transposed (issue 7; bench/NOTES.md session 28).
//
// Why: the head-dim-split pass (bwd_kv_split_sm90.cuh) spends about a quarter of its time getting
// each tile's dQ out of the SM by vector reductions (NOTES session 27: ~10-20 bytes a cycle per
// SM by any path), and dQ bytes per GEMM flop are 4 / kBlockN. Its keys are the M of every GEMM,
// so a block holds a multiple of 64 keys, and 128 do not fit the registers. Here the head dim is
// the M of the dK and dV GEMMs (as in FlashAttention-3 at d = 256: dKV_swapAB), so the keys are
// an N and may be 80: 20% fewer dQ bytes per flop.
//
//   per 64-row query tile (warpgroup w: keys 40w..40w+39 of S and dP, head-dim half w of the rest)
//   S  = Q K_w^T,  dP = dO V_w^T             WGMMA m64n40, operands in shared memory, K = 256
//   P = exp2(S c - lse2), dS = P (dP - delta)  registers, fp32 (FlashAttention-3's P)
//   P~, dS~ -> shared memory (queries x keys, stmatrix), one barrier of the two warpgroups
//   dQ_w   = dS~ K[:, half w]                 two WGMMA m64n64 slices (K = 80 keys), each added
//                                             by red.global.add.v4.f32 into dq_accum (tiled;
//                                             dq_finish_kernel rounds it once)
//   dV_w^T += dO[:, half w]^T P~,  dK_w^T += Q[:, half w]^T dS~   WGMMA m64n80, two M atoms each
//
// 5 GEMM-equivalents per (query tile, key tile), as FlashAttention-3. dK and dV are final where
// the keys' block holds every query head of its kv head; with GQA (AttnParams::kv_head_splits,
// since session 40 one block per query head by default, as FlashAttention-3) each block's fp32
// dK^T / dV^T partials are summed in dkv_accum and the key tile's last block stores the totals
// (sum_split_partials): a whole group per block left 8-head / 1-kv-head GQA at 1.6 waves of
// long blocks at N = 4k (-20 to -27% without a mask, bench/NOTES.md session 40).
// Registers per consumer thread: dK^T and dV^T 160 fp32, S and dP 40, a dQ slice 32. (Why dQ is sliced: a warpgroup's whole 64 x 128 half
// would take 64, leaving 16 of the 240 beside dK and dV for addresses and indices;
// FlashAttention-3 slices its d = 256 dQ GEMM for the same reason. Not tried unsliced here.)
// Shared memory: K, V 80 KB, Q two stages 64 KB, dO one stage 32 KB (released after the dV GEMM,
// so its next tile loads under the dK and dQ GEMMs), P~ and dS~ double buffered 40 KB: 216 KB.
// dQ's reductions vary in order: not bitwise reproducible (deterministic=True takes the mma.sync
// passes). With AttnParams::pair_counters it is the programmatic dependent of delta_kernel and
// counts its keys for dq_finish_kernel, as the split pass (pdl.cuh).
#pragma once

#include "../api/variants.h"
#include "../backward/bwd_common.cuh"
#include "../common/sm90.cuh"
#include "../common/tile.cuh"
#include "bwd_kv_common_sm90.cuh"

namespace gproj {
namespace sm90 {

template <typename T_, int kHeadDim_>
struct BwdKvDkvtTraits {
  using T = T_;
  using Element = typename CuteElement<T_>::type;
  static constexpr int kHeadDim = kHeadDim_, kHalf = kHeadDim_ / 2;
  static constexpr int kBlockM = 64, kBlockN = 80, kStagesQ = 2, kTileBufs = 2;
  static constexpr int kDqSlice = 64;  // dQ columns of one slice of a warpgroup's half
  static_assert(kHalf == 2 * kDqSlice, "two dQ slices per warpgroup");
  static constexpr int kNumMmaThreads = 256, kNumThreads = 384, kConsumerRegs = 240;
  using HD = Int<kHeadDim>;
  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  // Q (two stages) and dO (one): query rows x head dim, K-major for S / dP; viewed (head dim,
  // queries), head dim contiguous, they are the MN-major A operands of dK^T / dV^T.
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BM, HD>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<BM, HD, Int<kStagesQ>>{}));
  using SmemLayoutDO = decltype(tile_to_shape(SmemAtomQ{}, Shape<BM, HD>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HD, BM, Int<kStagesQ>>{}, Step<_2, _1, _3>{})));
  using SmemLayoutDOt =
      decltype(composition(SmemLayoutDO{}, make_ordered_layout(Shape<HD, BM>{}, Step<_2, _1>{})));
  // K and V (key rows x head dim), resident; K viewed (head dim, keys) is dQ's B operand.
  using SmemAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BN, HD>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<BN, HD>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_ordered_layout(Shape<HD, BN>{}, Step<_2, _1>{})));
  // P~ and dS~ as (queries, keys), keys contiguous: what stmatrix writes from the S / dP
  // accumulators (a query's 8 adjacent keys are one 16-byte row of an 8 x 8 block), dQ's K-major
  // A operand, and viewed (keys, queries) the MN-major B operand of dV^T / dK^T. 80 keys are 160
  // bytes, so the selector takes the 32-byte swizzle (as FlashAttention-3's 64 x 80 tile).
  using SmemAtomP = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BM, BN>());
  using SmemLayoutP = decltype(tile_to_shape(SmemAtomP{}, Shape<BM, BN, Int<kTileBufs>>{}));
  using SmemLayoutPt = decltype(composition(
      SmemLayoutP{}, make_ordered_layout(Shape<BN, BM, Int<kTileBufs>>{}, Step<_2, _1, _3>{})));

  // S / dP: the two warpgroups split the keys (N = 40 each).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN / 2>, HD>>(),
      Layout<Shape<_1, _2, _1>>{}));
  // dV^T / dK^T: one warpgroup's GEMM, M = its head-dim half (two m64 atoms), N = 80 keys.
  using TiledMmaKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BN, BM>, GMMA::Major::MN,
                           GMMA::Major::MN>()));
  // dQ slice: one warpgroup's GEMM, 64 queries x 64 head-dim columns, K = 80 keys.
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kDqSlice>, BN>, GMMA::Major::K,
                           GMMA::Major::MN>()));

  using PipelineQ = cutlass::PipelineTmaAsync<kStagesQ>;
  using PipelineDO = cutlass::PipelineTmaAsync<1>;
  using TmaQ = TmaLoad<Element, decltype(take<0, 2>(SmemLayoutQ{})), Shape<BM, HD>>;
  using TmaK = TmaLoad<Element, SmemLayoutK, Shape<BN, HD>>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDO>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> p;   // P~
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> ds;  // dS~
    // per query row, double buffered: {raw score max, log2 row sum} (stats) and rowstate's
    // {delta, lse2} (kPUnderDp reads lse2 there and fetches no stats)
    alignas(16) float2 row_st[2][kBlockM];
    alignas(16) float2 row_dl[2][kBlockM];
    int split_last;  // (kv_head_splits > 1) whether this block stores its key tile's sums
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) typename PipelineQ::SharedStorage pipe_q;
    alignas(16) typename PipelineDO::SharedStorage pipe_do;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 block may have");
};

template <class Traits>
struct BwdKvDkvtParams {
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaK tma_k, tma_v, tma_kc;  // (tma_kc: = tma_k; fa3 mode reads no K')
  int rows_q, rows_k, batch_q;
  AttnParams p;
};

// The epilogue's dK (scaled by alpha) and dV of warpgroup w, held transposed (rows: its half of
// the head dim, columns: the block's keys), rows past n_end dropped. Staged: rounded, written
// transposed into the K / V tiles' shared memory by stmatrix.trans (a key's 8 adjacent head-dim
// values are one 16-byte row), then 16-byte stores, a row's bytes by consecutive threads. Else
// (misaligned rows, fp32 dK asked for in p.dk_accum, or GPROJ_FWD_AB bit 32) element by element
// from the accumulators: slow, and only the tests and gproj_cuda/study.py ask for it (the
// staged and direct stores give the same bits: test_hopper_staged_epilogue_stores_the_same_bits).
template <class Traits, class TiledMma, class Acc, class Coords, class SmemT, class Smem>
__device__ __forceinline__ void store_dkv_transposed(const AttnParams& p, const SeqBounds& seq,
                                                     int b, int hk, int n0, int n_end, int w,
                                                     int tid, TiledMma const& mma_kv,
                                                     Acc const& tdKrdK, Acc const& tdVrdV,
                                                     Coords const& tdKcdK, SmemT& sKt, SmemT& sVt,
                                                     Smem& sK, Smem& sV) {
  using T = typename Traits::T;
  using Element = typename Traits::Element;
  constexpr int kHalf = Traits::kHalf, kBlockN = Traits::kBlockN;
  const int64_t k_row0 = seq.k_start + n0;
  T* gDK = reinterpret_cast<T*>(p.dk) + b * p.dk_stride[0] + k_row0 * p.dk_stride[1] + hk * p.dk_stride[2];
  T* gDV = reinterpret_cast<T*>(p.dv) + b * p.dv_stride[0] + k_row0 * p.dv_stride[1] + hk * p.dv_stride[2];
  const bool staged = rows_stageable(p, p.dv, p.dv_stride) && p.dk_accum == 0 &&
                      rows_stageable(p, p.dk, p.dk_stride);
  if (!staged) {
    float* gDKacc = p.dk_accum ? reinterpret_cast<float*>(p.dk_accum) + b * p.dk_stride[0] +
                                     k_row0 * p.dk_stride[1] + hk * p.dk_stride[2]
                               : nullptr;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(tdKrdK); ++i) {
      const int col = w * kHalf + get<0>(tdKcdK(i)), j = get<1>(tdKcdK(i));
      if (n0 + j >= n_end) continue;
      const float k = p.softmax_scale * tdKrdK(i);
      gDK[int64_t(j) * p.dk_stride[1] + col] = from_float<T>(k);
      gDV[int64_t(j) * p.dv_stride[1] + col] = from_float<T>(tdVrdV(i));
      if (gDKacc) gDKacc[int64_t(j) * p.dk_stride[1] + col] = k;
    }
    return;
  }
  Tensor rDK = make_tensor_like<Element>(tdKrdK);
  Tensor rDV = make_tensor_like<Element>(tdVrdV);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tdKrdK); i += 2) {
    reinterpret_cast<uint32_t*>(rDK.data())[i / 2] =
        pack2<T>(p.softmax_scale * tdKrdK(i), p.softmax_scale * tdKrdK(i + 1));
    reinterpret_cast<uint32_t*>(rDV.data())[i / 2] = pack2<T>(tdVrdV(i), tdVrdV(i + 1));
  }
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_kv);
  auto r2s_thr = r2s.get_thread_slice(tid & 127);
  auto tile = Shape<Int<kHalf>, Int<kBlockN>>{};
  copy(r2s, r2s_thr.retile_S(rDK), r2s_thr.partition_D(local_tile(sKt, tile, make_coord(w, _0{}))));
  copy(r2s, r2s_thr.retile_S(rDV), r2s_thr.partition_D(local_tile(sVt, tile, make_coord(w, _0{}))));
  wg_sync(w);  // (the warpgroup reads back only what it wrote: its half of every key row)
  constexpr int kChunks = kHalf / 8, kRowsPerPass = 128 / kChunks;
  const int t = tid & 127, col = w * kHalf + (t % kChunks) * 8, rows = n_end - n0;
  CUTLASS_PRAGMA_UNROLL
  for (int r = t / kChunks; r < kBlockN; r += kRowsPerPass) {
    if (r < rows) {
      st_global_v4(gDK + int64_t(r) * p.dk_stride[1] + col, ld_shared_v4(&sK(r, col)));
      st_global_v4(gDV + int64_t(r) * p.dv_stride[1] + col, ld_shared_v4(&sV(r, col)));
    }
  }
}

// A warp's 16 rows of a 16-bit copy of an m64nN WGMMA accumulator (rounded, in the accumulator's
// register layout) into `s` (rows x columns, 16-byte row chunks contiguous, any swizzle), columns
// col0.., buffer buf: per 8-column group one stmatrix.x2 (8 x 8 matrices: the group's rows 0-7
// and 8-15). row: this lane's row address, 16 (warp % 4) + (lane % 16) (lanes 16-31 repeat 0-15;
// x2 reads addresses from lanes 0-15 only). The lane's values of group g are the register pairs
// (row r, columns 2g, 2g + 1) of the row/column view, r = 0 in the first matrix, 1 in the second.
template <class Frag, class Smem>
__device__ __forceinline__ void stmatrix_rows(Frag const& r16, Smem& s, int row, int col0, int buf) {
  Tensor rc = make_tensor(r16.data(), acc_rowcol(r16.layout()));
  constexpr int kGroups = decltype(size<1>(rc))::value / 2;
  CUTLASS_PRAGMA_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(&s(row, col0 + 8 * g, buf)));
    const uint32_t r0 = *reinterpret_cast<const uint32_t*>(&rc(0, 2 * g));
    const uint32_t r1 = *reinterpret_cast<const uint32_t*>(&rc(1, 2 * g));
    asm volatile("stmatrix.sync.aligned.x2.m8n8.shared.b16 [%0], {%1, %2};\n" ::"r"(a), "r"(r0),
                 "r"(r1) : "memory");
  }
}

// stmatrix_rows by address: the same stores, with the lane's group-g address of buffer buf taken
// from two per-lane bases and constants. The P~ / dS~ layout (SmemLayoutP: 8 x 16 atoms of the
// 32-byte swizzle, atoms 2048 bytes apart along the keys, buffers kBufBytes apart) moves a
// lane's 16-byte chunk to its other half of the atom row from one 8-key group to the next (the
// swizzle flips address bit 4 with bit 7, which no offset below touches), and every second group
// into the next atom. With c0 = col0 / 8 (0 or 5: warpgroup w's first key 40 w), group g is
// chunk c0 + g: atom (c0 + g) / 2, so relative to group 0 the even groups are 2048 (g / 2)
// bytes on and the odd ones 2048 (g / 2 + w) on with bit 4 flipped:
//   even = addr(group 0, buffer 0),  odd = (even + 2048 w) ^ 16,
//   addr(g, buf) = (g even ? even : odd) + 2048 (g / 2) + kBufBytes buf
// (tests/host/ds_store_addresses.cu checks it for every lane, both warpgroups and buffers.)
// Through the layout each group's address took ~7 instructions of 64-bit generic arithmetic a
// tile (SASS, session 39); FlashAttention-3's stores take one register and immediates.
template <int kBufBytes, class Frag>
__device__ __forceinline__ void stmatrix_rows_at(Frag const& r16, uint32_t even, uint32_t odd,
                                                 int buf) {
  Tensor rc = make_tensor(r16.data(), acc_rowcol(r16.layout()));
  constexpr int kGroups = decltype(size<1>(rc))::value / 2;
  const uint32_t at = uint32_t(kBufBytes) * uint32_t(buf);
  CUTLASS_PRAGMA_UNROLL
  for (int g = 0; g < kGroups; ++g) {
    const uint32_t a = (g % 2 == 0 ? even : odd) + at + uint32_t(2048 * (g / 2));
    const uint32_t r0 = *reinterpret_cast<const uint32_t*>(&rc(0, 2 * g));
    const uint32_t r1 = *reinterpret_cast<const uint32_t*>(&rc(1, 2 * g));
    asm volatile("stmatrix.sync.aligned.x2.m8n8.shared.b16 [%0], {%1, %2};\n" ::"r"(a), "r"(r0),
                 "r"(r1) : "memory");
  }
}

// The Params of a TMA pipeline whose producer is warpgroup 0 (thread 0 leads) and whose
// consumers are the other `consumers` threads; `bytes` per stage.
template <class Pipeline>
__device__ __forceinline__ typename Pipeline::Params kv_pipe_params(int wg, int bytes,
                                                                    int consumers) {
  typename Pipeline::Params pp;
  pp.transaction_bytes = bytes;
  pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = consumers;
  return pp;
}

// kDvFirst: the order of a tile's dV and first dQ GEMMs (see the loop). kAb (session 39; both
// bits the default since, 0 for A/B runs as GPROJ_BWD_VARIANT=31): bit 1 (variant 28) computes P while dP is still on the tensor cores, with
// lse2 taken from rowstate (delta_kernel's, bit for bit load_row_softmax's) instead of formed from
// the stats, as FlashAttention-3's d = 256 backward (its SASS: S waited for alone, the exp2s
// under dP) and fa3 mode's d = 128 pass since session 37 (there the two together measured -3 to
// -5%; here -1.0 / -0.5 / 0 / -0.3% at 2k / 8k / 4k causal / 16k causal, one interleaved run);
// bit 2 (variant 29) stores P~ and dS~ by two 32-bit base addresses per lane and constant
// offsets (stmatrix_rows_at) instead of each group's address through the layout: -3 to -4%
// (SASS: 1066 -> 995 instructions a tile, no spill); both (variant 30, the default) the same.
// Bit 4 (variant 32): dK^T / dV^T per m64 atom with the dQ slices between them. Bit 8 (variant
// 33): each head's query tiles from the block's own diagonal tile on (KeyBlockWork::rot). Bit 16
// (variant 34): the tiles the mask cuts masked by key ranges per query row (mask_row_ranges).
// Bit 32 (variants 35, 36): the block's parts of each tile's dq_accum and rowstate addresses
// formed once, not per tile.
template <class Traits, bool kDvFirst, int kAb = 0>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kv_dkvt_sm90_kernel(CUTE_GRID_CONSTANT BwdKvDkvtParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kHalf = Traits::kHalf, kDqSlice = Traits::kDqSlice;
  using PipelineQ = typename Traits::PipelineQ;
  using PipelineDO = typename Traits::PipelineDO;
  constexpr bool kPUnderDp = (kAb & 1) != 0, kStoresByAddress = (kAb & 2) != 0;
  constexpr bool kAtomOrder = (kAb & 4) != 0;
  constexpr bool kRotated = (kAb & 8) != 0;  // (variant 33: from the block's diagonal tile on)
  constexpr bool kRowRangeMask = (kAb & 16) != 0;  // (variants 34-36)
  constexpr bool kHoistedAddresses = (kAb & 32) != 0;  // (variants 35, 36)
  const AttnParams& p = prm.p;

  // (causal: the first key blocks, which the most query tiles see, first; grid_tile)
  const GridTile gt =
      p.slot_rows ? slot_tile(p, reinterpret_cast<const int*>(p.cu_seqlens_k), p.heads_k, false)
                  : grid_tile(p, /*longest_last=*/false);
  // (kv_head_splits > 1, dense: the grid's heads are (kv head, share of its group) pairs)
  const int splits = p.kv_head_splits;
  const int n_block = gt.tile, hk = splits > 1 ? gt.head / splits : gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.nk) {  // uniform for the block, before any barrier
    if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);
    return;
  }
  const int n_end = min(n0 + kBlockN, seq.nk);
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
  const int group = p.heads / p.heads_k, block_heads = group / splits;
  const KeyBlockWork work(mask, n0, n_end, kBlockM, hk * group + (gt.head - hk * splits) * block_heads,
                          block_heads, false, kRotated);
  const int n_items = work.n_items;
  const float c = p.softmax_scale * 1.4426950408889634f;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    if (p.pair_counters) pdl_launch_dependents();
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  constexpr int kTileBytes = kBlockM * kHeadDim * int(sizeof(Element));
  constexpr int kConsumers = Traits::kNumMmaThreads;
  PipelineQ pipe_q(ss.pipe_q, kv_pipe_params<PipelineQ>(wg, kTileBytes, kConsumers), Shape<_1, _1, _1>{});
  PipelineDO pipe_do(ss.pipe_do, kv_pipe_params<PipelineDO>(wg, kTileBytes, kConsumers),
                     Shape<_1, _1, _1>{});
  __syncthreads();

  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDO{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutDOt{});
  Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), typename Traits::SmemLayoutP{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutP{});
  Tensor sPt = make_tensor(make_smem_ptr(ss.p.data()), typename Traits::SmemLayoutPt{});
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutPt{});
  const int bq = p.cu_seqlens_q ? 0 : b;
  if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 32);

  if (wg == 0) {
    // ---------------- producer: K, V once; per (head, query tile) item Q, then dO ----------------
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0 && n_items > 0) {
      auto tile_q = Shape<Int<kBlockM>, Int<kHeadDim>>{};
      auto tile_k = Shape<Int<kBlockN>, Int<kHeadDim>>{};
      Tensor mK = tma_rows(prm.tma_k, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
      Tensor mV = tma_rows(prm.tma_v, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, seq.k_start, hk, bq);
      auto [tKg, tKs] = tma_partition(prm.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(local_tile(mK, tile_k, make_coord(n_block, _0{}))));
      auto [tVg, tVs] = tma_partition(prm.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(local_tile(mV, tile_k, make_coord(n_block, _0{}))));
      ss.barrier_kv.arrive_and_expect_tx(2 * kBlockN * kHeadDim * int(sizeof(Element)));
      copy(prm.tma_k.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0), tKg, tKs);
      copy(prm.tma_v.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0), tVg, tVs);
      auto wq = cutlass::make_producer_start_state<PipelineQ>();
      auto wdo = cutlass::make_producer_start_state<PipelineDO>();
      ItemCursor cur(work);  // (no division per item: ItemCursor)
      for (int it = 0; it < n_items; ++it, cur = cur.next<kRotated>(work)) {
        const int h = cur.h, mb = cur.mb;
        auto load = [&](auto const& tma, auto smem, uint64_t* bar) {  // smem: the stage's tile
          Tensor m = tma_rows(tma, prm.rows_q, kHeadDim, p.heads, prm.batch_q, seq.q_start, h, bq);
          auto [tg, ts] = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(smem),
                                        group_modes<0, 2>(local_tile(m, tile_q, make_coord(_, _0{}))));
          copy(tma.with(*bar, 0), tg(_, mb), ts);
        };
        pipe_q.producer_acquire(wq);
        load(prm.tma_q, sQ(_, _, wq.index()), pipe_q.producer_get_barrier(wq));
        ++wq;
        // (dO has one stage: this waits until the consumers' dV GEMMs of the previous item are done)
        pipe_do.producer_acquire(wdo);
        load(prm.tma_do, sDO, pipe_do.producer_get_barrier(wdo));
        ++wdo;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  const int w = wg - 1;  // keys 40w.. of S and dP; head-dim half w of dK, dV and dQ
  const int lane128 = tid & 127;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaKV mma_kv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_kv = mma_kv.get_thread_slice(lane128);
  // shared-memory operands: the warpgroup's slice (warpgroup_slice says why); the one-warpgroup
  // GEMMs take their part of the operands by local_tile
  auto wg_sdp = warpgroup_slice(mma_sdp, w);
  auto wg_kv = mma_kv.get_slice(0);
  auto wg_dq = mma_dq.get_slice(0);
  Tensor tSrQ = wg_sdp.partition_fragment_A(sQ);
  Tensor tSrDO = wg_sdp.partition_fragment_A(sDO);
  Tensor tSrK = wg_sdp.partition_fragment_B(sK);
  Tensor tSrV = wg_sdp.partition_fragment_B(sV);
  Tensor tKVrQt = wg_kv.partition_fragment_A(
      local_tile(sQt, Shape<Int<kHalf>, Int<kBlockM>, Int<Traits::kStagesQ>>{}, make_coord(w, _0{}, _0{})));
  Tensor tKVrDOt =
      wg_kv.partition_fragment_A(local_tile(sDOt, Shape<Int<kHalf>, Int<kBlockM>>{}, make_coord(w, _0{})));
  Tensor tKVrPt = wg_kv.partition_fragment_B(sPt);
  Tensor tKVrdSt = wg_kv.partition_fragment_B(sdSt);
  Tensor tDQrdS = wg_dq.partition_fragment_A(sdS);
  auto slice_dq = Shape<Int<kDqSlice>, Int<kBlockN>>{};
  Tensor tDQrKt0 = wg_dq.partition_fragment_B(local_tile(sKt, slice_dq, make_coord(2 * w, _0{})));
  Tensor tDQrKt1 = wg_dq.partition_fragment_B(local_tile(sKt, slice_dq, make_coord(2 * w + 1, _0{})));
  // P~ / dS~ stores: stmatrix of the lane's warp's 16 query rows, one 8-key group at a time
  // (stmatrix_rows). (CuTe's tiled copy cannot split the 32-byte swizzle atoms of 16 keys at the
  // warpgroups' 40-key boundary: its layout algebra fails to compile there.)
  const int stsm_row = 16 * ((tid & 127) / 32) + (tid & 15);  // this lane's row address
  // kStoresByAddress: the lane's two bases (stmatrix_rows_at), P~'s; dS~'s are ds_from_p on
  constexpr int kBufBytes = cute::cosize_v<typename Traits::SmemLayoutP> / Traits::kTileBufs *
                            int(sizeof(Element));
  static_assert(kBufBytes % 2048 == 0 && Traits::kBlockN / 2 == 40,
                "the layout stmatrix_rows_at's offsets were checked on");
  const uint32_t st_even = static_cast<uint32_t>(__cvta_generic_to_shared(&sP(stsm_row, 40 * w, 0)));
  const uint32_t st_odd = (st_even + 2048u * uint32_t(w)) ^ 16u;
  const uint32_t ds_from_p = static_cast<uint32_t>(__cvta_generic_to_shared(ss.ds.data()) -
                                                   __cvta_generic_to_shared(ss.p.data()));

  auto shape_s = Shape<Int<kBlockM>, Int<kBlockN>>{};  // (queries, keys)
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(shape_s));
  Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(c_rc))::value;  // the lane's 2 query rows
  auto shape_kv = Shape<Int<kHalf>, Int<kBlockN>>{};     // (head-dim half, keys)
  Tensor tdKrdK = partition_fragment_C(mma_kv, shape_kv);
  Tensor tdVrdV = partition_fragment_C(mma_kv, shape_kv);
  clear(tdKrdK);
  clear(tdVrdV);
  Tensor tdKcdK = thr_kv.partition_C(make_identity_tensor(shape_kv));

  // Softmax state and delta of item `it`'s 64 query rows into ss.row_st / row_dl[it & 1] by
  // cp.async, a tile ahead: the first warp of each warpgroup fetches 32 of them; the barrier of
  // the two warpgroups after the tile's elementwise work publishes them (both read all 64). Rows
  // past the end are zero-filled (finite); the mask zeroes their P.
  const bool row_lane = lane128 < 32;
  // kHoistedAddresses: this block's rows of rowstate (batch b, the sequence's first row) and the
  // head stride, and this lane's slot of the sequence's first dq_accum tile, formed once. Per
  // tile the kernel formed them again from the parameters (rowstat_index, dq_tile_base and
  // dq_accum_tiles: 64-bit products, the varlen test, loads of the parameters; ~70 of the
  // 614 SASS instructions of an unmasked tile against FlashAttention-3's 513). The empty asm
  // keeps ptxas from re-deriving them from the parameters inside the loop, which is what it
  // did with plain hoisted values.
  const float* rs_block = reinterpret_cast<const float*>(p.rowstate) +
                          4 * (int64_t(b) * p.rs_batch_stride + seq.q_start);
  int64_t rs_head_stride = p.rs_head_stride;
  float* dq_block = reinterpret_cast<float*>(p.dq_accum) +
                    int64_t(dq_tile_base(p, b, seq.q_start)) * (kBlockM * kHeadDim) +
                    dq_accum_offset(w, kHeadDim, 0, lane128);
  int64_t dq_head_stride = int64_t(dq_accum_tiles(p)) * (kBlockM * kHeadDim);
  if constexpr (kHoistedAddresses) {
    asm volatile("" : "+l"(rs_block), "+l"(rs_head_stride), "+l"(dq_block), "+l"(dq_head_stride));
  }
  auto fetch_rows = [&](int it, int h, int mb) {  // (h, mb: item it's head and query tile)
    if (row_lane && it < n_items) {
      const int slot = (tid & 31) + 32 * w;
      const int i = mb * kBlockM + slot;
      const bool ok = i < seq.nq;
      const int64_t idx = ok ? rowstat_index(p, b, h, seq.q_start + i) : 0;
      if constexpr (!kPUnderDp)
        cp_async_zfill(&ss.row_st[it & 1][slot], reinterpret_cast<const float2*>(p.stats) + idx, ok);
      const float* rs = kHoistedAddresses
                            ? rs_block + (ok ? 4 * (h * rs_head_stride + i) : int64_t(0))
                            : reinterpret_cast<const float*>(p.rowstate) + 4 * idx;
      cp_async_zfill(&ss.row_dl[it & 1][slot], reinterpret_cast<const float2*>(rs), ok);
    }
    cute::cp_async_fence();
  };

  if (n_items > 0) {
    // Launched under the last wave of delta_kernel (pdl.cuh): the lanes that fetch rowstate first
    // wait for this pair's rows; the barrier below orders every consumer's reduce-adds after them.
    if (p.pair_counters && row_lane)
      counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) + b * p.heads_k + hk,
                           seq.nq * (p.heads / p.heads_k));
    ItemCursor cur(work);  // the items' heads and query tiles by steps (ItemCursor)
    fetch_rows(0, cur.h, cur.mb);
    cute::cp_async_wait<0>();
    consumers_sync();
    ss.barrier_kv.wait(0);
    typename PipelineQ::PipelineState rq;
    typename PipelineDO::PipelineState rdo;
    for (int it = 0; it < n_items; ++it) {
      const int h = cur.h, mb = cur.mb;
      cur = cur.next<kRotated>(work);  // item it + 1's, for fetch_rows below
      const int i0 = mb * kBlockM;
      const int buf = it & 1;  // row state, P~ and dS~
      const float2* row_st = ss.row_st[buf];
      const float2* row_dl = ss.row_dl[buf];
      Tensor tSrS = partition_fragment_C(mma_sdp, shape_s);
      Tensor tSrDP = partition_fragment_C(mma_sdp, shape_s);
      pipe_q.consumer_wait(rq);
      wg_gemm<true>(mma_sdp, tSrQ(_, _, _, rq.index()), tSrK, tSrS);
      pipe_do.consumer_wait(rdo);
      wg_gemm<true>(mma_sdp, tSrDO, tSrV, tSrDP);
      fetch_rows(it + 1, cur.h, cur.mb);  // into the other buffer, last read in tile it - 1 (before its barrier)
      // the lane's two query rows: log2-sum-exp (FlashAttention-3's P) and delta
      float lse2[kRows], delta[kRows];
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int qi = get<0>(c_rc(r, 0));
        const float2 dl = row_dl[qi];  // rowstate's {delta, lse2}
        lse2[r] = kPUnderDp ? dl.y : load_row_softmax(row_st[qi], c).lse2;
        delta[r] = dl.x;
      }
      warpgroup_wait<kPUnderDp ? 1 : 0>();  // (kPUnderDp: S only; dP stays on the tensor cores)
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor dp_rc = make_tensor(tSrDP.data(), acc_rowcol(tSrDP.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(s_rc); ++j)
          s_rc(r, j) = exp2_approx(fmaf(s_rc(r, j), c, -lse2[r]));
      // the mask on tiles it cuts only (one branch per tile; bwd_kv_split_sm90.cuh says why)
      if (mask.tile_partial(i0, i0 + kBlockM, n0, n0 + kBlockN)) {
        if constexpr (kRowRangeMask) {
          // Per query row, its visible keys as one range (Mask::row_columns): a compare against
          // a constant offset and a select per score. visible() per score is ~17 SASS
          // instructions here (ptxas branches around each score's test: the masked path is 342
          // instructions a tile on top of ~690), and 80-key blocks on 64-row tiles put ~2.2
          // tiles a block on the diagonal, 14% of a causal pass's tiles at 2k. A causal mask
          // (no left bound) needs the upper bound only, which also covers keys past the end
          // and padding rows (row_columns: hi = INT_MIN).
          auto keys = [&](int row, int col0, int& lo, int& hi) {
            mask.row_columns(i0 + row, n0 + col0, lo, hi);
          };
          if (mask.left < 0) {
            mask_row_ranges<false, true>(s_rc, c_rc, keys, 0.f);
          } else {
            mask_row_ranges<true, true>(s_rc, c_rc, keys, 0.f);
          }
        } else {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(s_rc); ++j)
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r)
              if (!mask.visible(i0 + get<0>(c_rc(r, j)), n0 + get<1>(c_rc(r, j)))) s_rc(r, j) = 0.f;
        }
      }
      if constexpr (kPUnderDp) warpgroup_wait<0>();  // dP
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(s_rc); ++j) dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - delta[r]);
      // P~ and dS~: rounded once each (fa3 mode: A = dS~)
      Tensor tOrP = make_tensor_like<Element>(tSrS);
      Tensor tOrdS = make_tensor_like<Element>(tSrDP);
      round_pairs<T>(tSrS, tOrP);
      round_pairs<T>(tSrDP, tOrdS);
      if constexpr (kStoresByAddress) {
        stmatrix_rows_at<kBufBytes>(tOrP, st_even, st_odd, buf);
        stmatrix_rows_at<kBufBytes>(tOrdS, st_even + ds_from_p, st_odd + ds_from_p, buf);
      } else {
        stmatrix_rows(tOrP, sP, stsm_row, 40 * w, buf);
        stmatrix_rows(tOrdS, sdS, stsm_row, 40 * w, buf);
      }
      cute::cp_async_wait<0>();                  // the next tile's rows have landed
      cutlass::arch::fence_view_async_shared();  // stmatrix writes -> WGMMA reads
      consumers_sync();                          // both halves of P~ and dS~ (and the rows) are in

      // dQ's first slice before dK, so that its reductions run while dK (and dV) are on the
      // tensor cores; the second after them (its accumulator takes the first's registers).
      // Without a mask dV goes first (kDvFirst): dO's single stage is freed one GEMM earlier for
      // the next tile's load, at the price of slice 0's reductions starting one GEMM later;
      // measured -1 to -3% unmasked and +1 to +2.5% causal at N = 2k-16k (bench/NOTES.md
      // session 29), so masked tiles keep dQ first.
      // dq_accum += dS~ K (unscaled), slice s of this warpgroup's 64 x 128 half in the order of
      // its m64n128 accumulator (tile.cuh, dq_accum_offset): a slice's values are that
      // accumulator's values 32 s .. 32 s + 31, a float4 per lane and step. (The lane's pointer
      // plus a constant per step, so that the reductions take immediate offsets: from a 32-bit
      // offset per step ptxas kept eight 64-bit addresses live, 16 registers.)
      float* g_dq = kHoistedAddresses
                        ? dq_block + h * dq_head_stride + int64_t(mb) * (kBlockM * kHeadDim)
                        : reinterpret_cast<float*>(p.dq_accum) +
                              (int64_t(h) * dq_accum_tiles(p) + dq_tile_base(p, b, seq.q_start) +
                               mb) * (kBlockM * kHeadDim) +
                              dq_accum_offset(w, kHeadDim, 0, lane128);
      auto add_dq = [&](auto const& acc, auto slice) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(acc); i += 4)
          red_add_f32x4(g_dq + dq_accum_offset(0, kHeadDim, i + 32 * decltype(slice)::value, 0),
                        make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3)));
      };
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kDqSlice>>{});
      if constexpr (kAtomOrder) {
        // (variant 32) FlashAttention-3's order at d = 256 (its SASS): dV and dK per m64 atom,
        // each dQ slice's reduce-adds issued while an atom runs. A reduce-add holds its source
        // registers until the memory pipe takes it, which under ~64 KB of reductions a tile
        // per SM is slow: in the order below, the next GEMM that writes those registers (dQ
        // slice 1, the next tile's S / dP) stalled on them (ncu, N = 8k: ~24% of the warps'
        // stall samples, bench/NOTES.md session 40).
        wg_gemm_atom<false>(mma_kv, tKVrDOt, tKVrPt(_, _, _, buf), tdVrdV, 0);
        wg_gemm<true>(mma_dq, tDQrdS(_, _, _, buf), tDQrKt0, tdQrdQ);
        wg_gemm_atom<false>(mma_kv, tKVrDOt, tKVrPt(_, _, _, buf), tdVrdV, 1);
        warpgroup_wait<1>();  // dV atom 0 and dQ slice 0 done
        add_dq(tdQrdQ, _0{});
        wg_gemm_atom<false>(mma_kv, tKVrQt(_, _, _, rq.index()), tKVrdSt(_, _, _, buf), tdKrdK, 0);
        warpgroup_wait<1>();  // dV done: dO is free
        pipe_do.consumer_release(rdo);
        ++rdo;
        wg_gemm<true>(mma_dq, tDQrdS(_, _, _, buf), tDQrKt1, tdQrdQ);
        warpgroup_wait<0>();  // dK atom 0, dQ slice 1
        add_dq(tdQrdQ, _1{});
        wg_gemm_atom<false>(mma_kv, tKVrQt(_, _, _, rq.index()), tKVrdSt(_, _, _, buf), tdKrdK, 1);
        warpgroup_wait<0>();  // dK done: the Q stage is free
        pipe_q.consumer_release(rq);
        ++rq;
        continue;
      }
      if constexpr (kDvFirst) {
        wg_gemm<false>(mma_kv, tKVrDOt, tKVrPt(_, _, _, buf), tdVrdV);
        wg_gemm<true>(mma_dq, tDQrdS(_, _, _, buf), tDQrKt0, tdQrdQ);
        wg_gemm<false>(mma_kv, tKVrQt(_, _, _, rq.index()), tKVrdSt(_, _, _, buf), tdKrdK);
        warpgroup_wait<2>();  // dV done: dO is free
        pipe_do.consumer_release(rdo);
        ++rdo;
        warpgroup_wait<1>();  // dQ slice 0 done
        add_dq(tdQrdQ, _0{});
      } else {
        wg_gemm<true>(mma_dq, tDQrdS(_, _, _, buf), tDQrKt0, tdQrdQ);
        wg_gemm<false>(mma_kv, tKVrDOt, tKVrPt(_, _, _, buf), tdVrdV);
        wg_gemm<false>(mma_kv, tKVrQt(_, _, _, rq.index()), tKVrdSt(_, _, _, buf), tdKrdK);
        warpgroup_wait<2>();  // dQ slice 0 done
        add_dq(tdQrdQ, _0{});
        warpgroup_wait<1>();  // dV done: dO is free
        pipe_do.consumer_release(rdo);
        ++rdo;
      }
      warpgroup_wait<0>();  // dK done: the Q stage is free
      pipe_q.consumer_release(rq);
      ++rq;
      wg_gemm<true>(mma_dq, tDQrdS(_, _, _, buf), tDQrKt1, tdQrdQ);
      warpgroup_wait<0>();
      add_dq(tdQrdQ, _1{});
    }
  }

  // ---------------- epilogue: dK = alpha dK, dV (this warpgroup's half), rows past the end dropped
  bool stores = true;
  if (splits > 1) {
    // (kv_head_splits > 1: this block's dK^T, dV^T are partial sums over its share of the group;
    // the key tile's last block to add them stores the totals, sum_split_partials)
    static_assert(kBlockN == dkv_tile_keys(kHeadDim, false) && Traits::kNumMmaThreads == 256,
                  "dkv_accum's tiles are the 80-key blocks of two consumer warpgroups");
    stores = sum_split_partials<kHeadDim, false>(p, b, hk, n_block, seq.nq, n_items > 0, tid, tdKrdK,
                                          tdVrdV, &ss.split_last, [] { consumers_sync(); });
  }
  consumers_sync();  // both warpgroups past their last GEMM: K and V's tiles are free to stage in
  if (stores)
    store_dkv_transposed<Traits>(p, seq, b, hk, n0, n_end, w, tid, mma_kv, tdKrdK, tdVrdV, tdKcdK,
                               sKt, sVt, sK, sV);
  if (p.pair_counters) {
    // Every consumer's dQ reduce-adds, dK and dV are issued: the block's keys counted for
    // dq_finish_kernel (pdl.cuh; the release orders what the barrier ordered before)
    consumers_sync();
    if (tid == 0)
      counter_add_release(reinterpret_cast<int*>(p.pair_counters) + (p.batch + b) * p.heads_k + hk,
                          n_end - n0);
  }
#endif
}

template <typename T, int kHeadDim>
void run_bwd_kv_dkvt(const AttnParams& p, int total_q, int total_k) {
  using Traits = BwdKvDkvtTraits<T, kHeadDim>;
  BwdKvDkvtParams<Traits> prm;
  set_kv_pass_tmas<Traits>(prm, p, total_q, total_k);
  // dV first without a mask (variant 17: dQ first there too, the order until session 29).
  // kAb: since session 39 bits 1 and 2 (variant 30's: -3 to -4% against the form before, variant
  // 31); variants 28 and 29 each alone (A/B). Since session 42 also bits 16 and 32 (variant 36's
  // form: the cut tiles masked by row ranges, the address parts formed once), measured
  // interleaved against session 39's default (variant 38; H100, bench/results/
  // session42_2026-12-05/ab_d256_forms_callA.txt): -2.6 / -2.7 / -3.9% at 2k / 8k / 16k, -2.6 /
  // -1.7 / -2.0% at 2k / 4k / 8k causal, -1.8 to -2.1% on GQA shapes; FlashAttention-3's order
  // (variant 32) alone 0 +- 0.7%, with 36's changes (35) within 1% of 36.
  const bool dv_first = !p.masked() && bwd_variant() != 17;
  const int v = bwd_variant();
  auto kernel = v == 28   ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 1>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 1>)
                : v == 29 ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 2>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 2>)
                : v == 31 ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 0>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 0>)
                : v == 32 ? bwd_kv_dkvt_sm90_kernel<Traits, true, 7>
                : v == 33 ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 11>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 11>)
                : v == 34 ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 19>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 19>)
                : v == 35 ? bwd_kv_dkvt_sm90_kernel<Traits, true, 55>
                : v == 38 ? (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 3>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 3>)
                          : (dv_first ? bwd_kv_dkvt_sm90_kernel<Traits, true, 51>
                                      : bwd_kv_dkvt_sm90_kernel<Traits, false, 51>);
  const int tiles = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if (tiles == 0) return;
  // (kv_head_splits > 1: a grid head per (kv head, share of its group); run_backward has checked
  // that the shares divide the group and that the call is dense)
  dim3 grid;
  if (!slot_grid(prm.p, Traits::kBlockN, total_k, p.heads_k, grid))
    grid = tile_grid(prm.p, tiles, p.heads_k * p.kv_head_splits, p.batch);
  launch_sm90(kernel, grid, Traits::kNumThreads, Traits::kSmemBytes, prm, p,
              "KV-outer backward, dK and dV transposed (sm90)",
              /*programmatic=*/p.pair_counters != 0 && bwd_variant() != 12);
}

}  // namespace sm90
}  // namespace gproj
