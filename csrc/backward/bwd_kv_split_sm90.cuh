// The Hopper (sm_90a) KV-outer backward pass at head dim 256: the head dim split between the two
// consumer warpgroups (issue 7). gproj's pass at d = 256; fa3 mode's until session 28 (now
// GPROJ_BWD_VARIANT=16: bwd_kv_dkvt_sm90.cuh's 80-key blocks replaced it there).
//
// Why a second design: bwd_kv_sm90.cuh gives each consumer warpgroup its own 64 keys with their
// whole dK and dV rows in registers; at d = 256 that is 2 x 64 x 256 fp32 per warpgroup, 256
// registers per thread, more than a thread may have. Here both warpgroups work on the same 64 keys
// and each owns one half of the head dim of dK, dV and dQ (64 + 64 registers, and 64 for a tile's
// dQ), as FlashAttention-3 does at d = 256. S and dP, which both halves need whole, are split by
// query columns instead, and the rounded tiles meet in shared memory:
//
//   per 64-row query tile (transposed, rows are keys; warpgroup w takes query columns 32w..32w+31)
//   S^T  = K Q_w^T,  dP^T = V dO_w^T          WGMMA m64n32, operands in shared memory, K = 256
//   P^T from the saved softmax state, dS^T = P^T (dP^T - delta)           registers, fp32
//   A = dS~ (fa3) or dS~ - lambda P~ (gproj, as two rounded parts hi + lo), P~ and A -> shared
//   memory (stmatrix), one barrier of the two warpgroups
//   dQ_w  = A K[:, half w]                     WGMMA m64n128 (gproj: one per part), then
//                                              red.global.add.v4.f32 into dq_accum (tiled;
//                                              dq_finish_kernel rounds it once)
//   dV_w += P~^T dO[:, half w],  dK_w += A^T Q[:, half w]   WGMMA m64n128 (gproj: Q' = Q - c_q,
//                                              one GEMM per part, plus c_q (x) colsum(A) per head)
//
// fa3: 5 GEMM-equivalents per (query tile, key tile), as FlashAttention-3; dK and dV are final.
// gproj (as the d = 64 / 128 default: 8 GEMM-equivalents in all): lambda = r / s comes from the
// λ pre-pass (bwd_lambda_sm90.cuh, S and dP: 2), then here S, dP, dV, dK (A's high part, then the
// zero-sum projection of dk_project.cuh; GPROJ_BWD_VARIANT 3, 4, 6: both parts), dQ (2 parts):
// 6. A is formed in fp32 from the rounded dS~ and P~ the pre-pass summed, so each row of A sums
// to zero to fp32 rounding, and hi + lo carry it to ~16 bits (the dQ GEMMs see that, not a
// re-rounded one-part dS~ - lambda P~, whose rows would not sum to zero: SPEC section 3). dQ as
// (hi + lo) K' instead of dS~ K' - lambda (P~ K') needs one accumulator instead of two (64
// registers, which is what d = 256 has left) and the same number of GEMMs; on the SPEC grid it
// meets every bar (bench/NOTES.md session 10).
// Shared memory: K, V 64 KB and two stages of Q and dO 128 KB; fa3: P~ and dS~ double buffered
// 32 KB (226 of the 227 KB a block may have); gproj: P~ and A's two parts single buffered 24 KB
// (Q' is made in place from the stage's Q). So the dQ tile goes to global memory by vector
// reductions from registers (no staging buffer for a bulk reduce-add, as bwd_kv_sm90.cuh has);
// their order varies: not bitwise reproducible (deterministic=True takes the mma.sync passes).
// With AttnParams::pair_counters (pdl.cuh) it is the programmatic dependent of the pass that
// writes rowstate and zero-fills dq_accum (delta_kernel, the λ pre-pass), each block waiting for
// its (sequence, kv head) pair's rows, and counts its keys once its dQ, dK and key sums are all
// written, for what follows (dK's key-sum totals and projection, dQ's rounding).
#pragma once

#include "../api/variants.h"
#include "../backward/bwd_common.cuh"
#include "../common/sm90.cuh"
#include "../common/tile.cuh"
#include "bwd_kv_common_sm90.cuh"
#include "../prepost/dk_project.cuh"

namespace gproj {
namespace sm90 {

template <typename T_, int kHeadDim_, bool kGProj_, int kDkParts_ = 1>
struct BwdKvSplitTraits {
  using T = T_;
  using Element = typename CuteElement<T_>::type;
  static constexpr bool kGProj = kGProj_;
  static_assert(!kGProj || std::is_same<T_, bf16>::value, "the Hopper gproj backward is bf16 only");
  // A = dS~ - lambda P~ in rounded parts (gproj: hi + lo; fa3: A = dS~, one). dQ takes both;
  // dK takes hi alone and is projected afterwards (kDkParts = 1: dk_project.cuh, as at d = 64
  // and 128), or both (2; GPROJ_BWD_VARIANT=6).
  static constexpr int kAParts = kGProj ? 2 : 1;
  static constexpr int kDkGemms = kGProj ? kDkParts_ : 1;
  static_assert(kDkParts_ == 1 || kDkParts_ == 2, "dK from one or two parts of A");
  static constexpr bool kProjectsDk = kGProj && kDkParts_ == 1;
  static constexpr int kHeadDim = kHeadDim_, kHalf = kHeadDim_ / 2;
  static constexpr int kBlockM = 64, kBlockN = 64, kStages = 2;
  // P~ and A's parts double buffered (fa3), or single (gproj: three tiles do not fit twice), with
  // one more barrier per tile before they are overwritten.
  static constexpr int kTileBufs = kGProj ? 1 : 2;
  static constexpr int kMmaWGs = 2, kNumMmaThreads = 256, kNumThreads = 384, kConsumerRegs = 240;
  using HD = Int<kHeadDim>;
  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  // Q and dO (query rows x head dim, K-major for S^T / dP^T), kStages deep; as the B operand of
  // dK / dV: (head dim, query rows), head dim contiguous (MN-major).
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BM, HD>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<BM, HD, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HD, BM, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K and V (key rows x head dim), resident; K also as dQ's B operand (head dim, keys).
  using SmemAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BN, HD>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<BN, HD>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_ordered_layout(Shape<HD, BN>{}, Step<_2, _1>{})));
  // P~ and the parts of A as (keys, queries), queries contiguous: the K-major A operand of
  // dV = P~^T dO and dK = A^T Q, and what stmatrix writes from the transposed accumulators (a
  // key's 8 adjacent queries are one 16-byte row of an 8x8 block). Viewed as (queries, keys) the
  // same bytes are dQ = A K's A operand, MN-major. Double buffered, tile t + 1's stores never
  // meet tile t's GEMM reads (both warpgroups wait for those before the barrier of tile t + 1).
  using SmemAtomP = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BN, BM>());
  using SmemLayoutP = decltype(tile_to_shape(SmemAtomP{}, Shape<BN, BM, Int<kTileBufs>>{}));
  using SmemLayoutPt = decltype(composition(
      SmemLayoutP{}, make_ordered_layout(Shape<BM, BN, Int<kTileBufs>>{}, Step<_2, _1, _3>{})));

  // S^T / dP^T: the warpgroups split the query columns (N); dV, dK and dQ: the head dim (N).
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM / 2>, HD>>(),
      Layout<Shape<_1, _2, _1>>{}));
  using TiledMmaKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHalf>, BM>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHalf>, BN>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  using TmaQ = TmaLoad<Element, decltype(take<0, 2>(SmemLayoutQ{})), Shape<BM, HD>>;
  using TmaK = TmaLoad<Element, SmemLayoutK, Shape<BN, HD>>;

  struct NoTiles {};
  struct GProjTiles {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> a_lo;  // A's second part
    alignas(16) float row_lo[2][kBlockM];  // lambda lo
    double colsum[2][kBlockN];             // per warpgroup, Σ_i A_ij of a head (the exchange)
    float row_sq[2][kBlockN];              // per warpgroup, ||dK_j||^2 of its half (the same)
  };
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;  // K' where centered
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> p;     // P~
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutP>, 1024> a_hi;  // dS~ (fa3), A hi
    std::conditional_t<kGProj, GProjTiles, NoTiles> gp;
    // per query row, double buffered: {raw score max, log2 row sum} and {delta, lambda hi}
    alignas(16) float2 row_st[2][kBlockM];
    alignas(16) float2 row_dl[2][kBlockM];
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) typename Pipeline::SharedStorage pipe_q;
    int split_last;  // (kv_head_splits > 1) whether this block stores its key tile's sums
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 block may have");
};

template <class Traits>
struct BwdKvSplitParams {
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaK tma_k, tma_v, tma_kc;  // (tma_kc: K' where centered, else = tma_k)
  int rows_q, rows_k, batch_q;
  AttnParams p;
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kv_split_sm90_kernel(CUTE_GRID_CONSTANT BwdKvSplitParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  constexpr bool kGProj = Traits::kGProj;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  const AttnParams& p = prm.p;

  // (causal: the first key blocks, which the most query tiles see, first; grid_tile)
  // (varlen: a grid of slots, every warp finding its block's tile by slot_tile, from L1)
  const GridTile gt =
      p.slot_rows ? slot_tile(p, reinterpret_cast<const int*>(p.cu_seqlens_k), p.heads_k, false)
                  : grid_tile(p, /*longest_last=*/false);
  // (gproj, kv_head_splits > 1, dense: the grid's heads are (kv head, share of its group) pairs;
  // fa3 mode's variant 16 has no split group, launch.cu refuses it)
  const int splits = kGProj ? p.kv_head_splits : 1;
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
                          block_heads);
  const int n_items = work.n_items;
  const float c = p.softmax_scale * 1.4426950408889634f;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    // (the next pass may launch once every block has started: it waits for its pairs' keys)
    if (p.pair_counters) pdl_launch_dependents();
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    if (p.k_centered) cute::prefetch_tma_descriptor(prm.tma_kc.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename Pipeline::Params pp;
  pp.transaction_bytes = 2 * kBlockM * kHeadDim * int(sizeof(Element));  // Q and dO of a stage
  pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kNumMmaThreads;
  Pipeline pipe_q(ss.pipe_q, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
  Element* alo_ptr = ss.a_hi.data();  // fa3: never used
  if constexpr (kGProj) alo_ptr = ss.gp.a_lo.data();
  Tensor sP = make_tensor(make_smem_ptr(ss.p.data()), typename Traits::SmemLayoutP{});
  Tensor sAhi = make_tensor(make_smem_ptr(ss.a_hi.data()), typename Traits::SmemLayoutP{});
  Tensor sAlo = make_tensor(make_smem_ptr(alo_ptr), typename Traits::SmemLayoutP{});
  Tensor sAhit = make_tensor(make_smem_ptr(ss.a_hi.data()), typename Traits::SmemLayoutPt{});
  Tensor sAlot = make_tensor(make_smem_ptr(alo_ptr), typename Traits::SmemLayoutPt{});
  const int bq = p.cu_seqlens_q ? 0 : b;
  // A programmatic dependent ends after its primary: its last block waits for it, by a thread
  // with nothing else to do (pdl.cuh).
  if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 32);

  if (wg == 0) {
    // ---------------- producer: K, V once; Q, dO per query tile ----------------
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0 && n_items > 0)
      produce_kv_pass_tiles<false, kBlockM, kBlockN, kHeadDim>(
          prm, p, seq, b, bq, hk, n_block, work, sK, sV, sQ, sDO, sQ, ss.barrier_kv, pipe_q);
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  const int w = wg - 1;  // this consumer warpgroup: query columns 32w.., head dim half w
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaKV mma_kv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_kv = mma_kv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  // shared-memory operands: the warpgroup's slice (warpgroup_slice says why)
  auto wg_sdp = warpgroup_slice(mma_sdp, w);
  auto wg_kv = warpgroup_slice(mma_kv, w);
  auto wg_dq = warpgroup_slice(mma_dq, w);
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);
  Tensor tSrDO = wg_sdp.partition_fragment_B(sDO);
  Tensor tKVrP = wg_kv.partition_fragment_A(sP);
  Tensor tKVrAhi = wg_kv.partition_fragment_A(sAhi);
  Tensor tKVrAlo = wg_kv.partition_fragment_A(sAlo);
  Tensor tKVrQt = wg_kv.partition_fragment_B(sQt);
  Tensor tKVrDOt = wg_kv.partition_fragment_B(sDOt);
  Tensor tDQrAhi = wg_dq.partition_fragment_A(sAhit);
  Tensor tDQrAlo = wg_dq.partition_fragment_A(sAlot);
  Tensor tDQrKt = wg_dq.partition_fragment_B(sKt);
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto r2s_thr = r2s.get_thread_slice(tid);
  Tensor tRSsP = r2s_thr.partition_D(sP);
  Tensor tRSsAhi = r2s_thr.partition_D(sAhi);
  Tensor tRSsAlo = r2s_thr.partition_D(sAlo);

  auto shape_s = Shape<Int<kBlockN>, Int<kBlockM>>{};  // (keys, queries)
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(shape_s));
  Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(c_rc))::value;  // the lane's 2 key rows
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(tdKrdK);
  clear(tdVrdV);
  Tensor tdKcdK = thr_kv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // gproj: per key row, Σ over this warpgroup's queries of a head of A (fp32 in a tile, an fp32
  // pair of ~48 bits across tiles, PairSum; bwd_kv_sm90.cuh says why more than fp32), for the
  // rank-one term c_q (x) colsum(A) of dK.
  PairSum colsum[kRows];

  // Softmax state and delta of item `it`'s query rows into ss.row_st / row_dl[it & 1] by
  // cp.async, a tile ahead; the first warp of each warpgroup fetches the 32 rows its warpgroup
  // reads (its query columns), and the barrier of the two warpgroups after the tile's elementwise
  // work publishes them. Rows past the end are zero-filled (finite); the mask zeroes their P.
  const bool row_lane = (tid & 127) < 32;
  auto fetch_rows = [&](int it, int h, int mb) {  // (h, mb: item it's head and query tile)
    if (row_lane && it < n_items) {
      const int slot = (tid & 31) + 32 * w;
      const int i = mb * kBlockM + slot;
      const bool ok = i < seq.nq;
      const int64_t idx = ok ? rowstat_index(p, b, h, seq.q_start + i) : 0;
      cp_async_zfill(&ss.row_st[it & 1][slot], reinterpret_cast<const float2*>(p.stats) + idx, ok);
      const float* rs = reinterpret_cast<const float*>(p.rowstate) + 4 * idx;
      cp_async_zfill(&ss.row_dl[it & 1][slot], reinterpret_cast<const float2*>(rs), ok);
      if constexpr (kGProj) cp_async_zfill(&ss.gp.row_lo[it & 1][slot], rs + 2, ok);
    }
    cute::cp_async_fence();
  };

  if (n_items > 0) {
    // Launched under the last wave of the pass that writes rowstate and zero-fills dq_accum
    // (pdl.cuh): the lanes that fetch rowstate first wait for this pair's rows; the barrier
    // below orders every consumer's reduce-adds after them.
    if (p.pair_counters && row_lane)
      counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) + b * p.heads_k + hk,
                           seq.nq * (p.heads / p.heads_k));
    ItemCursor cur(work);  // the items' heads and query tiles by steps (head-major)
    fetch_rows(0, cur.h, cur.mb);
    cute::cp_async_wait<0>();
    consumers_sync();
    ss.barrier_kv.wait(0);
    PipelineState rd;
    for (int it = 0; it < n_items; ++it) {
      const int h = cur.h, mb = cur.mb;
      cur = cur.next(work);  // item it + 1's, for fetch_rows below
      const int i0 = mb * kBlockM;
      const int buf = it & 1;                      // row state
      const int tbuf = it % Traits::kTileBufs;     // P~ and A
      const float2* row_st = ss.row_st[buf];
      const float2* row_dl = ss.row_dl[buf];
      Tensor tSrS = partition_fragment_C(mma_sdp, shape_s);
      Tensor tSrDP = partition_fragment_C(mma_sdp, shape_s);
      pipe_q.consumer_wait(rd);
      wg_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, rd.index()), tSrS);
      wg_gemm<true>(mma_sdp, tSrV, tSrDO(_, _, _, rd.index()), tSrDP);
      fetch_rows(it + 1, cur.h, cur.mb);  // into the other buffer, last read in tile it - 1 (before its barrier)
      warpgroup_wait<0>();
      // P^T from the saved softmax state (gproj: exp2(fma(s - m, c, -log2 l)), the exact-max P;
      // fa3: FA3's exp2(fma(s, c, -lse2))), masked entries zeroed on tiles the mask cuts;
      // dS^T = P^T (dP^T - delta) in place, both fp32.
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor dp_rc = make_tensor(tSrDP.data(), acc_rowcol(tSrDP.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s_rc); j += 2) {
        // columns j, j + 1: the adjacent queries qi, qi + 1, one 16-byte shared load each
        const int qi = get<1>(c_rc(0, j));
        const float4 st2 = *reinterpret_cast<const float4*>(&row_st[qi]);
        CUTLASS_PRAGMA_UNROLL
        for (int jj = 0; jj < 2; ++jj) {
          const float2 st = jj == 0 ? make_float2(st2.x, st2.y) : make_float2(st2.z, st2.w);
          const float lse2 = load_row_softmax(st, c).lse2;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            if constexpr (kGProj) {
              s_rc(r, j + jj) = exp2_approx(fmaf(s_rc(r, j + jj) - st.x, c, -st.y));
            } else {
              s_rc(r, j + jj) = exp2_approx(fmaf(s_rc(r, j + jj), c, -lse2));
            }
          }
        }
      }
      // The mask in a pass of its own, on tiles it cuts only (one branch per tile). Tested per
      // entry inside the exp2 loop, ptxas branched around each entry's test on every tile:
      // this form measured -1.8 to -3.0% for the fa3 backward at d = 256 and -3.6 to -6.9% for
      // gproj's (interleaved, both directions; bench/NOTES.md session 19).
      if (mask.tile_partial(i0, i0 + kBlockM, n0, n0 + kBlockN)) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(s_rc); ++j)
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r)
            if (!mask.visible(i0 + get<1>(c_rc(r, j)), n0 + get<0>(c_rc(r, j)))) s_rc(r, j) = 0.f;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s_rc); j += 2) {
        const float4 dl2 = *reinterpret_cast<const float4*>(&row_dl[get<1>(c_rc(0, j))]);
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - dl2.x);
          dp_rc(r, j + 1) = s_rc(r, j + 1) * (dp_rc(r, j + 1) - dl2.z);
        }
      }
      // P~ and dS~: rounded once each. fa3: A = dS~. gproj: A = dS~ - lambda P~ in fp32 from
      // those rounded values (lambda as hi + lo), so every row of A sums to zero to fp32
      // rounding, then split into two rounded parts, hi and lo = A - hi.
      Tensor tOrP = make_tensor_like<Element>(tSrS);
      Tensor tOrAhi = make_tensor_like<Element>(tSrDP);
      Tensor tOrAlo = make_tensor_like<Element>(tSrDP);  // (gproj only: no registers in fa3)
      round_pairs<T>(tSrS, tOrP);
      round_pairs<T>(tSrDP, tOrAhi);
      if constexpr (kGProj) {
        const float* row_lo = ss.gp.row_lo[buf];
        Tensor p_rc = make_tensor(tOrP.data(), acc_rowcol(tSrS.layout()));
        Tensor hi_rc = make_tensor(tOrAhi.data(), acc_rowcol(tSrS.layout()));
        Tensor lo_rc = make_tensor(tOrAlo.data(), acc_rowcol(tSrS.layout()));
        float tile_sum[kRows];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) tile_sum[r] = 0.f;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(p_rc); j += 2) {
          const int qi = get<1>(c_rc(0, j));
          const float4 dl2 = *reinterpret_cast<const float4*>(&row_dl[qi]);
          const float2 lo2 = *reinterpret_cast<const float2*>(&row_lo[qi]);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const float2 pt = unpack2<T>(reg_pair(p_rc, r, j));
            const float2 ds = unpack2<T>(reg_pair(hi_rc, r, j));  // (still dS~ here)
            const float a0 = fmaf(-lo2.x, pt.x, fmaf(-dl2.y, pt.x, ds.x));
            const float a1 = fmaf(-lo2.y, pt.y, fmaf(-dl2.w, pt.y, ds.y));
            const uint32_t hi = pack2<T>(a0, a1);
            const float2 hf = unpack2<T>(hi);
            reg_pair(hi_rc, r, j) = hi;
            reg_pair(lo_rc, r, j) = pack2<T>(a0 - hf.x, a1 - hf.y);
            tile_sum[r] += a0;
            tile_sum[r] += a1;
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) colsum[r].add(tile_sum[r]);
      }
      // single buffers: the other warpgroup's GEMMs of the previous tile (waited for at its end)
      // have read them
      if constexpr (Traits::kTileBufs == 1) consumers_sync();
      copy(r2s, r2s_thr.retile_S(tOrP), tRSsP(_, _, _, tbuf));
      copy(r2s, r2s_thr.retile_S(tOrAhi), tRSsAhi(_, _, _, tbuf));
      if constexpr (kGProj) copy(r2s, r2s_thr.retile_S(tOrAlo), tRSsAlo(_, _, _, tbuf));
      // gproj: dK's GEMM takes the centered queries Q' = Q - c_q, rounded as the centering
      // pre-pass rounds them (the queries' rule, center_keys.cuh: exact or one rounding of a
      // centered value), so this warpgroup makes its 32 rows of the stage's Q into Q' in place
      // once its S GEMM has read them (here, where only dK and dV hold registers: right after S,
      // it spilled 64 bytes),
      // instead of a third tile per stage loaded from a Q' in global memory (two stages of Q,
      // dO and Q' do not fit beside K and V). The barrier below publishes them; with c_q = 0
      // (the lazy pre-pass found no offset) the subtraction leaves Q as it is.
      if constexpr (kGProj) {
        const T* cq = reinterpret_cast<const T*>(p.q_shift) + (int64_t(b) * p.heads + h) * kHeadDim;
        const int lane128 = tid & 127, col = (lane128 % (kHeadDim / 8)) * 8;
        const uint4 c8 = *reinterpret_cast<const uint4*>(cq + col);
        constexpr int kRowsPerPass = 128 / (kHeadDim / 8);
        // (explicit shared loads and stores, four rows in flight: generic LD / ST one row at a
        // time waited for each load in turn)
#pragma unroll 4
        for (int r = lane128 / (kHeadDim / 8); r < kBlockM / 2; r += kRowsPerPass) {
          Element* x = &sQ(32 * w + r, col, rd.index());
          st_shared_v4(x, sub8<T>(ld_shared_v4(x), c8));
        }
      }

      cute::cp_async_wait<0>();                  // the next tile's rows have landed
      cutlass::arch::fence_view_async_shared();  // stmatrix (and Q') writes -> WGMMA reads
      consumers_sync();                          // both halves of P~, A, Q' (and the rows) are in

      // dQ first, so that its reductions run while dV and dK are on the tensor cores.
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      wg_gemm<true>(mma_dq, tDQrAhi(_, _, _, tbuf), tDQrKt, tdQrdQ);
      if constexpr (kGProj) wg_gemm<false>(mma_dq, tDQrAlo(_, _, _, tbuf), tDQrKt, tdQrdQ);
      wg_gemm<false>(mma_kv, tKVrP(_, _, _, tbuf), tKVrDOt(_, _, _, rd.index()), tdVrdV);
      wg_gemm<false>(mma_kv, tKVrAhi(_, _, _, tbuf), tKVrQt(_, _, _, rd.index()), tdKrdK);
      if constexpr (Traits::kDkGemms == 2)
        wg_gemm<false>(mma_kv, tKVrAlo(_, _, _, tbuf), tKVrQt(_, _, _, rd.index()), tdKrdK);
      warpgroup_wait<Traits::kDkGemms + 1>();  // dQ done (dV and dK may still run)
      // dq_accum += A K (unscaled): this warpgroup's 64 x 128 half in accumulator order
      // (tile.cuh, dq_accum_offset), a float4 per lane and step, consecutive lanes contiguous.
      {
        const int lane128 = tid & 127;
        float* g = reinterpret_cast<float*>(p.dq_accum) +
                   (int64_t(h) * dq_accum_tiles(p) + dq_tile_base(p, b, seq.q_start) + mb) *
                       (kBlockM * kHeadDim);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(tdQrdQ); i += 4)
          red_add_f32x4(g + dq_accum_offset(w, kHeadDim, i, lane128),
                        make_float4(tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3)));
      }
      warpgroup_wait<0>();  // dV, dK done: the stage is free
      pipe_q.consumer_release(rd);
      ++rd;

      if constexpr (kGProj) {
        if (cur.h != h) {  // (the next item's head differs: head-major, past the end too)
          // The head's last tile: dK += c_q (x) colsum(A), with colsum over all 64 queries of
          // every tile: this warpgroup's half plus the other's, exchanged through shared memory
          // (the two warpgroups' threads at the same position hold the same key rows).
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const double sum = quad_sum(colsum[r].value());
            if ((tid & 3) == 0) ss.gp.colsum[w][get<0>(c_rc(r, 0))] = sum;
          }
          consumers_sync();
          const T* cq = reinterpret_cast<const T*>(p.q_shift) + (int64_t(b) * p.heads + h) * kHeadDim;
          Tensor dk_rc = make_tensor(tdKrdK.data(), acc_rowcol(tdKrdK.layout()));
          Tensor dkc_rc = make_tensor(tdKcdK.data(), acc_rowcol(tdKcdK.layout()));
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            // (fixed order: warpgroup 0's sum first, so both halves of a row use the same value)
            const double cs = ss.gp.colsum[0][get<0>(c_rc(r, 0))] + ss.gp.colsum[1][get<0>(c_rc(r, 0))];
            colsum[r] = PairSum{};
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < size<1>(dk_rc); ++j)
              dk_rc(r, j) += float(cs * double(to_float(cq[get<1>(dkc_rc(r, j))])));
          }
        }
      }
    }
  }

  // ---------------- epilogue: dK = alpha dK, dV (this warpgroup's half), rows past the end dropped
  // (kv_head_splits > 1: this block's dK, dV are partial sums over its share of the group, each
  // head's c_q (x) colsum(A) term included; the key tile's last block to add them stores the
  // totals and their key sums, sum_split_partials)
  bool stores = true;
  if constexpr (kGProj) {
    static_assert(kBlockN == dkv_tile_keys(kHeadDim, kGProj) && Traits::kNumMmaThreads == 256,
                  "dkv_accum's tiles are the 64-key blocks of two consumer warpgroups");
    if (splits > 1)
      stores = sum_split_partials<kHeadDim, kGProj>(p, b, hk, n_block, seq.nq, n_items > 0, tid,
                                                    tdKrdK, tdVrdV, &ss.split_last,
                                                    [] { consumers_sync(); });
  }
  // (one part of A in dK, kProjectsDk: dK leaves in fp32 only, with its key sums below;
  // dk_project.cuh projects it and rounds it once)
  // (store_dk_dv_epilogue: 16-bit dK and dV through the K and V tiles' shared memory, this
  // warpgroup's half of the head dim, once both warpgroups are past their last GEMM: each read
  // all of K and V)
  if (stores)
    store_dk_dv_epilogue<T, kHeadDim / 2, Traits::kProjectsDk>(
        p, seq, b, hk, n0, n_end, 0, w * (kHeadDim / 2), w, tid, [] { consumers_sync(); }, mma_kv,
        tdKrdK, tdVrdV, tdKcdK, sK, sV);
  if constexpr (Traits::kProjectsDk) if (stores) {  // (block-uniform)
    // The block's 64 keys are one p.dk_keysum slot (kKeysumSlot): Σ_j dK_j per column (each
    // warpgroup its half) and Σ_j ||dK_j|| (rows whole: the halves' squared norms exchanged
    // through shared memory), fp64, in a fixed order, from exactly the fp32 values written above.
    static_assert(kKeysumSlot == kBlockN, "one key-sum slot per block");
    Tensor dk_rc = make_tensor(tdKrdK.data(), acc_rowcol(tdKrdK.layout()));
    Tensor dkc_rc = make_tensor(tdKcdK.data(), acc_rowcol(tdKcdK.layout()));
    constexpr int kCols = decltype(size<1>(dk_rc))::value;
    double colsum_dk[kCols];
    float row_sq[kRows];
    dk_key_partials(dk_rc, dkc_rc, n0, n_end, p.softmax_scale, colsum_dk, row_sq);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r)
      if ((tid & 3) == 0) ss.gp.row_sq[w][get<0>(dkc_rc(r, 0))] = row_sq[r];
    consumers_sync();  // (also: both warpgroups are past their last GEMM, so the Q ring is free)
    double norms = 0.0;
    if (w == 0 && (tid & 3) == 0) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r) {
        const int row = get<0>(dkc_rc(r, 0));
        norms += double(sqrtf(ss.gp.row_sq[0][row] + ss.gp.row_sq[1][row]));
      }
    }
    CUTLASS_PRAGMA_UNROLL
    for (int m = 1; m < 32; m <<= 1) norms += __shfl_xor_sync(0xffffffffu, norms, m);
    // per-warp partials staged in the Q ring, then summed over the four warps in order
    constexpr int kRow = Traits::kHalf + 1;
    double* part = reinterpret_cast<double*>(ss.q.data()) + w * 4 * kRow;
    const int wtid = tid & 127, warp = wtid / 32, lane = tid & 31;
    if (lane < 4) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kCols; ++j)
        part[warp * kRow + get<1>(dkc_rc(0, j)) - w * Traits::kHalf] = colsum_dk[j];
      if (lane == 0) part[warp * kRow + Traits::kHalf] = norms;
    }
    wg_sync(w);
    double* out = reinterpret_cast<double*>(p.dk_keysum) +
                  ((int64_t(b) * p.heads_k + hk) * dk_keysum_slots(p) + n_block) * (kHeadDim + 1);
    for (int t = wtid; t < kRow; t += 128) {
      double acc = 0.0;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) acc += part[k * kRow + t];
      if (t < Traits::kHalf) {
        out[w * Traits::kHalf + t] = acc;
      } else if (w == 0) {
        out[kHeadDim] = acc;  // Σ_j ||dK_j|| (warpgroup 0 took every row's norm)
      }
    }
  }
  if (p.pair_counters) {
    // Every consumer's dQ reduce-adds, dK, dV and key sums are issued: the block's keys counted
    // for the passes that follow (pdl.cuh; the release orders what the barrier ordered before)
    consumers_sync();
    if (tid == 0)
      counter_add_release(reinterpret_cast<int*>(p.pair_counters) + (p.batch + b) * p.heads_k + hk,
                          n_end - n0);
  }
#endif
}

template <typename T, int kHeadDim, bool kGProj, int kDkParts = 1>
void run_bwd_kv_split(const AttnParams& p, int total_q, int total_k) {
  using Traits = BwdKvSplitTraits<T, kHeadDim, kGProj, kDkParts>;
  BwdKvSplitParams<Traits> prm;
  set_kv_pass_tmas<Traits>(prm, p, total_q, total_k);
  auto kernel = bwd_kv_split_sm90_kernel<Traits>;
  const int tiles = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if (tiles == 0) return;
  dim3 grid;
  if (!slot_grid(prm.p, Traits::kBlockN, total_k, p.heads_k, grid))
    grid = tile_grid(prm.p, tiles, p.heads_k * (kGProj ? p.kv_head_splits : 1), p.batch);
  launch_sm90(kernel, grid, Traits::kNumThreads, Traits::kSmemBytes, prm, p,
              "KV-outer backward, head dim split (sm90)",
              /*programmatic=*/p.pair_counters != 0 && bwd_variant() != 12);
}

}  // namespace sm90
}  // namespace gproj
