// GProj's Q-outer pass for Hopper (sm_90a): the first kernel of the gproj Hopper backward
// (backward_passes = 8: this, then the KV-outer pass of bwd_kv_sm90.cuh for dK and dV);
// backward_passes = 4 runs its λ part alone so a test can compare its rowstate with the mma.sync
// dQ pass's.
//
// Per query row i: delta_i = Σ_d dO_id O_id, and over every visible key j the row sums of exactly
// the rounded values the gradient GEMMs consume, r_i = Σ_j bf16(dS_ij), s_i = Σ_j bf16(P_ij)
// (fp32 within a key tile, then across tiles as fp32 pairs, ~48 bits, where the mma.sync pass
// uses fp64: bwd_dq_kernel.cuh says why more than fp32; the per-tile fp32 sums' own rounding,
// 2^-24 of a tile's partial sum, is far above the pair's 2^-48), then
// lambda = r / s as two fp32 parts. Writes rowstate = {delta, lambda hi, lambda lo, delta + lambda}.
// With kDq (the full backward) it also finishes dQ, SPEC section 3 exactly:
//   dQ_i = alpha [ (dS~ K')_i - lambda_i (P~ K')_i ]
// both products accumulated over every key tile in fp32 WGMMA registers and combined once at the
// end, when lambda is known. Doing dQ here, where a block owns its query rows, needs no dQ
// accumulator in global memory, no reduce-adds and no finishing kernel, and it leaves the
// KV-outer pass with register operands only (no dS~ through shared memory), so that pass's two
// warpgroups no longer wait for each other every tile. Its order is fixed: bitwise reproducible.
//
// Block = producer warpgroup (TMA: Q and dO once, K and V per key tile through two mbarrier
// pipelines) + two consumer warpgroups (64 query rows each) taking turns at the tensor cores
// (pingpong): S = Q K^T and dP = dO V^T by WGMMA with both operands in shared memory, then P, dS
// and the row sums in registers; with kDq, dS~ K' and P~ K' by WGMMA with P~, dS~ straight from
// registers (K' read transposed from the same shared tile). 2 (λ only) or 4 of the gproj
// backward's 8 GEMM-equivalents.
#pragma once

#include "../backward/bwd_common.cuh"
#include "../common/sm90.cuh"
#include "../common/tile.cuh"

namespace gproj {
namespace sm90 {

template <typename T_, int kHeadDim_, int kBlockN_, int kStages_, bool kDq_>
struct LambdaTraits : Sm90Tiles<T_, kHeadDim_, kBlockN_, kStages_> {
  using Base = Sm90Tiles<T_, kHeadDim_, kBlockN_, kStages_>;
  using typename Base::Element;
  using typename Base::SmemLayoutK;
  using typename Base::SmemLayoutQ;
  using typename Base::Pipeline;
  static constexpr int kBlockM = Base::kBlockM;
  static constexpr bool kDq = kDq_;
  // kDq: leave a tile's two dQ GEMMs in flight under the next tile's S and dP (waited for with
  // them) instead of waiting right after issuing them. Needs P~, dS~ of one tile and S, dP of the
  // next in registers at once. Measured (scripts/bwd_ab.py, NOTES.md session 6): on at d = 64
  // (+1%); on at d = 128 it fits too (4 bytes of spill, as without) but cost 9-10%.
  static constexpr bool kOverlapDq = kDq_ && kHeadDim_ == 64;
  // dQ's GEMMs consume the rounded P~ and dS~ as they are: the operand type must be the one the
  // row sums were taken in (bf16; fp16 gproj keeps the mma.sync passes).
  static_assert(!kDq || std::is_same<T_, bf16>::value, "the Hopper gproj dQ is bf16 only");
  using TiledMma = typename Base::TiledMmaQK;  // S = Q K^T and dP = dO V^T
  using TiledMmaDq = typename Base::TiledMmaPV;      // dS~ K' and P~ K', the P V form
  using SmemLayoutKt = typename Base::SmemLayoutVt;  // K'^T
  // kTensorRowSums: the row sums r = dS~ 1 and s = P~ 1 by the tensor cores, from the same
  // A-operand registers as the dQ GEMMs, against a tile of ones (8 columns, the smallest WGMMA
  // N): one m64n8 GEMM per k-slab instead of an unpack and an FADD per value and sum (4 of the
  // ~14 instructions per score here). Each tile's sums are taken fresh (fp32 over its kBlockN
  // values, as before) and added across tiles in fp64. Measured (NOTES.md session 7): -11% for
  // this pass at d = 128, +16-18% at d = 64, where its dQ GEMMs are N = 64 and stay in flight
  // under the next tile's S and dP (kOverlapDq) and eight more WGMMAs per tile cost more than
  // the instructions they save; so d = 128 only.
  static constexpr bool kTensorRowSums = kDq_ && kHeadDim_ == 128;
  // delta = Σ_d dO O from shared memory's dO (the TMA tile the dP GEMM reads) and O loaded by the
  // consumers, to the accumulator lanes by shuffles, instead of O and dO both loaded from global
  // memory and handed over through shared memory and a barrier of both warpgroups. Measured both
  // directions against the previous build (bench/NOTES.md session 20 item 2): this pass -3.1 /
  // -3.2% at d = 128 N = 2k, -3.7 / -2.0% at 4k, -1.3 / -1.4% GQA 4k, +0.3 / -0.4% 8k causal;
  // -1.5 / -1.3% at d = 256 (λ only) 2k. At d = 64 +1.0 to +4.5% (+1.2 to +2.6% with a barrier
  // before the pingpong), at 16k too, where a block's start is ~1% of its time, with the key
  // loop's SASS the same but for 3 instructions (not located): so d = 64 keeps the old start.
  static constexpr bool kDeltaFromSmem = kHeadDim_ >= 128;
  struct NoRowTiles {};
  struct RowTiles {  // !kDeltaFromSmem: delta and the softmax state, handed over
    float delta[Base::kBlockM];
    float2 stats[Base::kBlockM];
  };
  using TiledMmaOnes = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, _8, Int<Base::kBlockN>>>(),
      typename Base::AtomLayout{}));
  using SmemLayoutOnes = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, _8,
                                                          Int<Base::kBlockN>>(),
      Shape<_8, Int<Base::kBlockN>>{}));

  struct NoOnes {};
  struct Ones {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutOnes>, 1024> tile;
  };
  using OnesTile = std::conditional_t<kTensorRowSums, Ones, NoOnes>;
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    OnesTile ones;  // kTensorRowSums
    std::conditional_t<kDeltaFromSmem, NoRowTiles, RowTiles> rows;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;  // Q and dO loaded
    alignas(16) typename Pipeline::SharedStorage pipe_k;
    alignas(16) typename Pipeline::SharedStorage pipe_v;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

template <class Traits>
struct LambdaKernelParams {
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaKV tma_k, tma_v;
  typename Traits::TmaKV tma_kc;  // K' where centered (reads_centered_keys), else = tma_k
  int rows_q, rows_k, batch_q;
  AttnParams p;
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    lambda_sm90_kernel(CUTE_GRID_CONSTANT LambdaKernelParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  using TG = typename GradGemmType<T, true>::type;  // the values the gradient GEMMs will see
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  const AttnParams& p = prm.p;

  // (causal: the longest query tiles first, grid_tile)
  // (varlen: a grid of slots, every warp finding its block's tile by slot_tile, from L1)
  const GridTile gt =
      p.slot_rows ? slot_tile(p, reinterpret_cast<const int*>(p.cu_seqlens_q), p.heads, true)
                  : grid_tile(p, /*longest_last=*/true);
  const int m_block = gt.tile, h = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  const int m0 = m_block * kBlockM;
  if (m0 >= seq.nq) return;  // uniform for the block, before any barrier
  // (the KV-outer pass may launch once every block has started: it waits for its pairs' rows)
  if (p.pair_counters && threadIdx.x == 0) pdl_launch_dependents();
  const int m_end = min(m0 + kBlockM, seq.nq);
  const int hk = h / (p.heads / p.heads_k);
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
  int nb_min, nb_max;  // key tiles this query tile needs
  mask.key_blocks(m0, m_end, kBlockN, nb_min, nb_max);

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    if (p.k_centered) cute::prefetch_tma_descriptor(prm.tma_kc.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    ss.barrier_q.init(1);
  }
  const typename Pipeline::Params pp = Traits::ring_params(wg);
  Pipeline pipe_k(ss.pipe_k, pp, Shape<_1, _1, _1>{});
  Pipeline pipe_v(ss.pipe_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutK{});
  const int bq = p.cu_seqlens_q ? 0 : b;

  if (wg == 0) {
    // ---------------- producer ----------------
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0 && nb_max > nb_min) {
      auto view = [&](auto const& tma, int rows, int heads, int start, int head) {
        return tma_rows(tma, rows, kHeadDim, heads, prm.batch_q, start, head, bq);
      };
      Tensor mQ = view(prm.tma_q, prm.rows_q, p.heads, seq.q_start, h);
      Tensor mDO = view(prm.tma_do, prm.rows_q, p.heads, seq.q_start, h);
      auto const& tma_k = reads_centered_keys(p, b, hk) ? prm.tma_kc : prm.tma_k;
      Tensor mK = view(tma_k, prm.rows_k, p.heads_k, seq.k_start, hk);
      Tensor mV = view(prm.tma_v, prm.rows_k, p.heads_k, seq.k_start, hk);
      auto tile_q = select<0, 2>(typename Traits::TileShape{});
      auto tile_k = select<1, 2>(typename Traits::TileShape{});
      auto [tQg, tQs] = tma_partition(prm.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                      group_modes<0, 2>(local_tile(mQ, tile_q, make_coord(m_block, _0{}))));
      auto [tDg, tDs] = tma_partition(prm.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDO),
                                      group_modes<0, 2>(local_tile(mDO, tile_q, make_coord(m_block, _0{}))));
      auto [tKg, tKs] = tma_partition(tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK),
                                      group_modes<0, 2>(local_tile(mK, tile_k, make_coord(_, _0{}))));
      auto [tVg, tVs] = tma_partition(prm.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV),
                                      group_modes<0, 2>(local_tile(mV, tile_k, make_coord(_, _0{}))));
      ss.barrier_q.arrive_and_expect_tx(2 * kBlockM * kHeadDim * int(sizeof(Element)));
      copy(prm.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q), 0), tQg, tQs);
      copy(prm.tma_do.with(reinterpret_cast<uint64_t&>(ss.barrier_q), 0), tDg, tDs);
      PipelineState wr = cutlass::make_producer_start_state<Pipeline>();
      for (int nb = nb_max - 1; nb >= nb_min; --nb) {
        pipe_k.producer_acquire(wr);
        copy(tma_k.with(*pipe_k.producer_get_barrier(wr), 0), tKg(_, nb), tKs(_, wr.index()));
        pipe_v.producer_acquire(wr);
        copy(prm.tma_v.with(*pipe_v.producer_get_barrier(wr), 0), tVg(_, nb), tVs(_, wr.index()));
        ++wr;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = threadIdx.x - 128;
  const float c = p.softmax_scale * 1.4426950408889634f;

  if constexpr (!Traits::kDq) {
    // Where the KV-outer pass adds dQ into p.dq_accum (gproj at d = 256; variant 4), this block's
    // 64-row tiles of it are zero-filled here, while the first TMA loads are in flight, instead
    // of by a memset pass before (30 us at d = 256, 16k tokens x 2048: NOTES.md session 10).
    // (Not by the producer's idle warps: at their 24 registers the loop spilled.)
    if (p.dq_accum) {
      for (int t = 0; t < kBlockM / 64; ++t) {
        const int mb64 = m_block * (kBlockM / 64) + t;
        if (mb64 * 64 >= seq.nq) break;
        float4* acc = reinterpret_cast<float4*>(reinterpret_cast<float*>(p.dq_accum) +
            (int64_t(h) * dq_accum_tiles(p) + dq_tile_base(p, b, seq.q_start) + mb64) * (64 * kHeadDim));
        for (int i = tid; i < 64 * kHeadDim / 4; i += Traits::kNumMmaThreads)
          acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    // (the split group, kv_head_splits > 1, dense: its workspace starts at zero, one share per
    // block, counted with the block's rows below)
    if (p.kv_head_splits > 1)
      zero_split_sums_share(p, b, h, m_block, (p.seqlen_q + kBlockM - 1) / kBlockM, tid,
                            Traits::kNumMmaThreads);
  }
  // The rows' softmax state (2 threads per row: row tid / 2; rows past the end get the state of a
  // row that sees no key) and delta = Σ_d dO O (each thread every other 16-byte chunk of the row,
  // in order, then the pair): kDeltaFromSmem, O loaded now and dO read from shared memory once it
  // is there (below); else O and dO from global memory here, both handed to the accumulator
  // lanes through shared memory and a barrier of both warpgroups.
  const int r_own = tid >> 1, part = tid & 1;
  const bool row_ok = m0 + r_own < m_end;
  // the row's softmax state first: its load then overlaps O's (issued after the dot product, it
  // waited for a second round trip to global memory; ncu put 4.9% of the d = 64 pass's warp
  // samples at the barrier after it). Measured both directions (bench/NOTES.md session 19 item
  // 10): this pass -0.6 to -1.4%.
  float2 st = make_float2(INFINITY, 0.f);
  if (part == 0 && row_ok)
    st = reinterpret_cast<const float2*>(p.stats)[rowstat_index(p, b, h, seq.q_start + m0 + r_own)];
  const int64_t q_row = seq.q_start + m0 + r_own;
  const T* orow = reinterpret_cast<const T*>(p.out) + b * p.o_stride[0] + q_row * p.o_stride[1] +
                  h * p.o_stride[2];
  const T* drow = reinterpret_cast<const T*>(p.dout) + b * p.do_stride[0] +
                  q_row * p.do_stride[1] + h * p.do_stride[2];
  // 16-byte loads (what launch.cu requires of out and dout): the scalar loop's 64 dependent loads
  // per thread held every consumer warp at the first barrier (7.5% of the pass's samples, ncu
  // a7c1656); it stays as a safety net
  const bool rows_vec = ((reinterpret_cast<uintptr_t>(orow) | reinterpret_cast<uintptr_t>(drow)) & 15) == 0;
  constexpr int kOChunks = kHeadDim / 16;  // this thread's 16-byte chunks: part, part + 2, ...
  uint4 o_chunk[kOChunks];
  float acc = 0.f;
  auto dot_from_global = [&]() {  // (the safety net: this thread's half of the row, scalar)
    for (int d = part; d < kHeadDim; d += 2) acc += to_float(orow[d]) * to_float(drow[d]);
  };
  if constexpr (Traits::kDeltaFromSmem) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kOChunks; ++i)
      o_chunk[i] = row_ok && rows_vec ? *reinterpret_cast<const uint4*>(orow + 8 * (part + 2 * i))
                                      : make_uint4(0u, 0u, 0u, 0u);
  } else {
    if (row_ok && rows_vec) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kOChunks; ++i)
        acc = dot8_accumulate<T>(*reinterpret_cast<const uint4*>(orow + 8 * (part + 2 * i)),
                                 *reinterpret_cast<const uint4*>(drow + 8 * (part + 2 * i)), acc);
    } else if (row_ok) {
      dot_from_global();
    }
    acc += __shfl_xor_sync(0xffffffff, acc, 1);
    if (part == 0) {
      ss.rows.delta[r_own] = acc;
      ss.rows.stats[r_own] = st;
    }
  }
  Element* ones_ptr = nullptr;  // kTensorRowSums only
  if constexpr (Traits::kTensorRowSums) {
    ones_ptr = ss.ones.tile.data();
    for (int i = tid; i < cute::cosize_v<typename Traits::SmemLayoutOnes>; i += 256)
      ones_ptr[i] = Element(1.f);
    cutlass::arch::fence_view_async_shared();  // generic writes -> the WGMMA's reads
  }
  // (!kDeltaFromSmem: the handed-over rows; kTensorRowSums: the ones tile both warpgroups read)
  if constexpr (!Traits::kDeltaFromSmem || Traits::kTensorRowSums)
    asm volatile("bar.sync 1, 256;\n" ::: "memory");

  typename Traits::TiledMma mma;
  auto thr = mma.get_thread_slice(tid);
  auto wg_mma = warpgroup_slice(mma, wg - 1);  // shared-memory operands (warpgroup_slice says why)
  Tensor tSrQ = wg_mma.partition_fragment_A(sQ);
  Tensor tSrDO = wg_mma.partition_fragment_A(sDO);
  Tensor tSrK = wg_mma.partition_fragment_B(sK);
  Tensor tSrV = wg_mma.partition_fragment_B(sV);
  Tensor tScS = thr.partition_C(make_identity_tensor(select<0, 1>(typename Traits::TileShape{})));
  Tensor tSrS = partition_fragment_C(mma, select<0, 1>(typename Traits::TileShape{}));
  Tensor tSrDP = partition_fragment_C(mma, select<0, 1>(typename Traits::TileShape{}));
  Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
  Tensor dp_rc = make_tensor(tSrDP.data(), acc_rowcol(tSrDP.layout()));
  Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(s_rc))::value;

  // kDq: the two dQ accumulators (this warpgroup's 64 rows x head dim, fp32)
  typename Traits::TiledMmaDq mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
  Tensor tDQrKt = warpgroup_slice(mma_dq, wg - 1).partition_fragment_B(sKt);
  auto shape_dq = Shape<Int<kBlockM>, Int<kHeadDim>>{};
  Tensor tDQrDS = partition_fragment_C(mma_dq, shape_dq);  // Σ_j dS~ K'
  Tensor tDQrPK = partition_fragment_C(mma_dq, shape_dq);  // Σ_j P~ K'
  Tensor tDQcDQ = thr_dq.partition_C(make_identity_tensor(shape_dq));
  if constexpr (Traits::kDq) {
    clear(tDQrDS);
    clear(tDQrPK);
  }
  // kTensorRowSums: this tile's r and s (every column of the 64 x 8 accumulators is the row sum)
  typename Traits::TiledMmaOnes mma_ones;
  Tensor sOnes = make_tensor(make_smem_ptr(ones_ptr), typename Traits::SmemLayoutOnes{});
  Tensor tOnesrB = warpgroup_slice(mma_ones, wg - 1).partition_fragment_B(sOnes);
  Tensor tRrR = partition_fragment_C(mma_ones, Shape<Int<kBlockM>, _8>{});
  Tensor tRrS = partition_fragment_C(mma_ones, Shape<Int<kBlockM>, _8>{});

  RowSoftmax rsm[kRows];
  float delta[kRows];
  PairSum r_sum[kRows], s_sum[kRows];  // across tiles: fp32 pairs, ~48 bits (device.cuh)
  if constexpr (Traits::kDeltaFromSmem) {
    // dO from shared memory where the tile has keys (its TMA load waited for here), else from
    // global memory; then delta and the softmax state to the accumulator lanes by shuffles: a
    // warp's accumulator rows are its own 16 rows here (row R of the tile: lane 2 (R mod 16)).
    if (nb_max > nb_min) ss.barrier_q.wait(0);
    if (nb_max > nb_min && rows_vec) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kOChunks; ++i)
        acc = dot8_accumulate<T>(o_chunk[i], ld_shared_v4(&sDO(r_own, 8 * (part + 2 * i))), acc);
    } else if (row_ok) {
      dot_from_global();
    }
    acc += __shfl_xor_sync(0xffffffff, acc, 1);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int src = 2 * (get<0>(c_rc(r, 0)) & 15);
      delta[r] = __shfl_sync(0xffffffff, acc, src);
      const float2 st_r = make_float2(__shfl_sync(0xffffffff, st.x, src),
                                      __shfl_sync(0xffffffff, st.y, src));
      rsm[r] = load_row_softmax(st_r, c);
    }
    // Both consumer warpgroups start the pingpong together (with the ones tile, its barrier
    // above did that).
    if constexpr (!Traits::kTensorRowSums) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  } else {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(c_rc(r, 0));
      rsm[r] = load_row_softmax(ss.rows.stats[row], c);
      delta[r] = ss.rows.delta[row];
    }
  }
  // kTensorRowSums: add the last waited-for tile's row sums (rows in the S accumulator's order)
  auto add_tile_sums = [&]() {
    if constexpr (!Traits::kTensorRowSums) return;
    Tensor r_rc = make_tensor(tRrR.data(), acc_rowcol(tRrR.layout()));
    Tensor s_rc1 = make_tensor(tRrS.data(), acc_rowcol(tRrS.layout()));
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRows; ++r) {
      r_sum[r].add(r_rc(r, 0));
      s_sum[r].add(s_rc1(r, 0));
    }
  };

  if (nb_max > nb_min) {
    if constexpr (!Traits::kDeltaFromSmem) ss.barrier_q.wait(0);
    // Pingpong (the forward's named barriers 8 and 9): the warpgroups take turns issuing their
    // GEMMs, so one's elementwise work runs while the other's GEMMs are on the tensor cores.
    // Consumer 0 goes first; each turn is a wait/pass pair, the same number in both warpgroups
    // (same key tiles), and consumer 0's closing wait consumes consumer 1's last pass.
    const int consumer = wg - 1;
    if (consumer == 1) turn_pass(consumer);
    PipelineState rd, rd_prev;  // K and V advance together
    // kDq: P~ and dS~ as A-operand registers (kOverlapDq: live until the next tile's wait)
    Tensor tOrP = make_tensor_like<Element>(tSrS);
    Tensor tOrDS = make_tensor_like<Element>(tSrDP);
    for (int nb = nb_max - 1; nb >= nb_min; --nb) {
      turn_wait(consumer);
      pipe_k.consumer_wait(rd);
      wg_gemm<true>(mma, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
      pipe_v.consumer_wait(rd);
      wg_gemm<true>(mma, tSrDO, tSrV(_, _, _, rd.index()), tSrDP);
      turn_pass(consumer);
      warpgroup_wait<0>();  // (kOverlapDq: and the previous tile's dQ GEMMs)
      if constexpr (!Traits::kDq) pipe_k.consumer_release(rd);  // (kDq: K' is dQ's B operand)
      if constexpr (Traits::kOverlapDq) {
        if (nb < nb_max - 1) {
          pipe_k.consumer_release(rd_prev);
          add_tile_sums();
        }
      }
      pipe_v.consumer_release(rd);
      // P in place, one branch-free pass; entries the mask hides zeroed only on tiles it cuts
      const int n0 = nb * kBlockN;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(s_rc); ++j) s_rc(r, j) = recompute_p<true>(s_rc(r, j), rsm[r], c);
      if (mask.tile_partial(m0, m0 + kBlockM, n0, n0 + kBlockN)) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r)
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(s_rc); ++j)
            if (!mask.visible(m0 + get<0>(c_rc(r, j)), n0 + get<1>(c_rc(r, j)))) s_rc(r, j) = 0.f;
      }
      if constexpr (Traits::kDq) {
        // dS = P (dP - delta) in place, both rounded once into A-operand registers; the row sums
        // are taken over exactly those 16-bit values (kTensorRowSums: by the tensor cores).
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r)
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(dp_rc); ++j) dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - delta[r]);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(tSrS); i += 2) {  // a lane's column pairs: one conversion each
          reinterpret_cast<uint32_t*>(tOrP.data())[i / 2] = pack2<T>(tSrS(i), tSrS(i + 1));
          reinterpret_cast<uint32_t*>(tOrDS.data())[i / 2] = pack2<T>(tSrDP(i), tSrDP(i + 1));
        }
        if constexpr (!Traits::kTensorRowSums) {  // fp32 within the tile, from the registers
          // (a lane's column pair (r, j), (r, j + 1) is one register: unpacked as a pair, a
          // shift and a mask, where an element at a time took a PRMT more for the high half)
          Tensor p_rc = make_tensor(tOrP.data(), acc_rowcol(tSrS.layout()));
          Tensor ds_rc = make_tensor(tOrDS.data(), acc_rowcol(tSrDP.layout()));
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            float rt = 0.f, st = 0.f;
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < size<1>(p_rc); j += 2) {
              const float2 d2 = unpack2<T>(reg_pair(ds_rc, r, j));
              const float2 p2 = unpack2<T>(reg_pair(p_rc, r, j));
              rt += d2.x;
              rt += d2.y;
              st += p2.x;
              st += p2.y;
            }
            r_sum[r].add(rt);
            s_sum[r].add(st);
          }
        }
        Tensor tOrDSa = make_tensor(tOrDS.data(), acc_to_a_layout(tSrDP.layout()));
        Tensor tOrPa = make_tensor(tOrP.data(), acc_to_a_layout(tSrS.layout()));
        wg_gemm<false>(mma_dq, tOrDSa, tDQrKt(_, _, _, rd.index()), tDQrDS);
        wg_gemm<false>(mma_dq, tOrPa, tDQrKt(_, _, _, rd.index()), tDQrPK);
        if constexpr (Traits::kTensorRowSums) {
          wg_gemm<true>(mma_ones, tOrDSa, tOnesrB, tRrR);  // r of this tile
          wg_gemm<true>(mma_ones, tOrPa, tOnesrB, tRrS);   // s of this tile
        }
        // Without kOverlapDq waited here, not under the next tile's S and dP: with both in
        // flight the A operands and the S / dP accumulators would need more than 240 registers
        // at d = 128. The other warpgroup's GEMMs keep the tensor cores busy meanwhile.
        if constexpr (!Traits::kOverlapDq) {
          warpgroup_wait<0>();
          pipe_k.consumer_release(rd);
          add_tile_sums();
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) {
          float rt = 0.f, st = 0.f;  // this tile's sums, fp32
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(s_rc); j += 2) {  // (rounded and unpacked as pairs)
            const float2 d2 = unpack2<TG>(pack2<TG>(s_rc(r, j) * (dp_rc(r, j) - delta[r]),
                                                     s_rc(r, j + 1) * (dp_rc(r, j + 1) - delta[r])));
            const float2 p2 = unpack2<TG>(pack2<TG>(s_rc(r, j), s_rc(r, j + 1)));
            rt += d2.x;
            rt += d2.y;
            st += p2.x;
            st += p2.y;
          }
          r_sum[r].add(rt);
          s_sum[r].add(st);
        }
      }
      rd_prev = rd;
      ++rd;
    }
    if constexpr (Traits::kOverlapDq) {
      warpgroup_wait<0>();  // the last tile's dQ GEMMs
      pipe_k.consumer_release(rd_prev);
      add_tile_sums();
    }
    if (consumer == 0) turn_wait(consumer);
  }

  // kDq: dQ rounded, in accumulator form, for the staged stores below
  using Element = typename Traits::Element;
  Tensor rDQ = make_tensor_like<Element>(tDQrDS);
  Tensor dq16_rc = make_tensor(rDQ.data(), acc_rowcol(tDQrDS.layout()));
  const bool dq_staged = Traits::kDq && rows_stageable(p, p.dq, p.dq_stride);
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = get<0>(c_rc(r, 0));
    // (kTensorRowSums: every lane of the quad already holds its rows' whole sums)
    const double rs = Traits::kTensorRowSums ? r_sum[r].value() : quad_sum(r_sum[r].value());
    const double sv = Traits::kTensorRowSums ? s_sum[r].value() : quad_sum(s_sum[r].value());
    float lam = 0.f, lam_lo = 0.f;
    split_lambda(rs, sv, lam, lam_lo);
    if ((tid & 3) == 0 && m0 + row < m_end) {
      const int64_t idx = rowstat_index(p, b, h, seq.q_start + m0 + row);
      // (fourth: delta + lambda rounded once, the KV-outer pass's A = P (dP - (delta + lambda)))
      const float dlam = float(double(delta[r]) + (double(lam) + double(lam_lo)));
      reinterpret_cast<float4*>(p.rowstate)[idx] = make_float4(delta[r], lam, lam_lo, dlam);
    }
    if constexpr (Traits::kDq) {
      // dQ = alpha (dS~ K' - lambda_hi P~ K'), one rounding (lambda_lo would move dQ by 2^-24 of
      // the correction); rows past the end dropped. The S and dQ accumulators share row order.
      Tensor ds_rc = make_tensor(tDQrDS.data(), acc_rowcol(tDQrDS.layout()));
      Tensor pk_rc = make_tensor(tDQrPK.data(), acc_rowcol(tDQrPK.layout()));
      Tensor cdq_rc = make_tensor(tDQcDQ.data(), acc_rowcol(tDQcDQ.layout()));
      auto dq_pair = [&](int j) {  // columns j, j + 1 of row r, rounded as a pair
        const float x0 = __fsub_rn(ds_rc(r, j), __fmul_rn(lam, pk_rc(r, j)));
        const float x1 = __fsub_rn(ds_rc(r, j + 1), __fmul_rn(lam, pk_rc(r, j + 1)));
        return pack2<T>(p.softmax_scale * x0, p.softmax_scale * x1);
      };
      if (dq_staged) {  // into registers, stored below
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(ds_rc); j += 2)
          *reinterpret_cast<uint32_t*>(&dq16_rc(r, j)) = dq_pair(j);
      } else if (m0 + row < m_end) {
        const int64_t qrow = seq.q_start + m0 + row;
        T* gdq = reinterpret_cast<T*>(p.dq) + b * p.dq_stride[0] + qrow * p.dq_stride[1] +
                 h * p.dq_stride[2];
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(ds_rc); j += 2)
          *reinterpret_cast<uint32_t*>(gdq + get<1>(cdq_rc(r, j))) = dq_pair(j);
      }
    }
  }
  if constexpr (Traits::kDq) {
    // Staged: through this warpgroup's own 64 rows of the Q tile (only its own S GEMMs read
    // them; the last was waited for), 16 bytes per thread (stage_and_store_rows).
    if (dq_staged) {
      wg_sync(wg - 1);  // every warp of the warpgroup is past its last GEMM
      T* gdq = reinterpret_cast<T*>(p.dq) + b * p.dq_stride[0] +
               (seq.q_start + m0) * p.dq_stride[1] + h * p.dq_stride[2];
      stage_and_store_rows<kHeadDim>(gdq, p.dq_stride[1], m_end - m0, 64 * (wg - 1), 0, wg - 1,
                                     tid, mma_dq, rDQ, sQ);
    }
  }
  // This warpgroup's rows of rowstate are written: counted for the KV-outer pass, which waits for
  // its (sequence, kv head) pair's rows (pdl.cuh). At the end, where only this warp waits for the
  // stores to land. (By the producer's idle second warp instead, any code there made ptxas spill
  // in the consumers' key loop.) The λ-only pre-pass (d = 256) counts the block's rows once both
  // warpgroups are done: both zero-filled each of its dq_accum tiles.
  if (p.pair_counters) {
    if constexpr (Traits::kDq) {
      wg_sync(wg - 1);
      if ((tid & 127) == 0)
        counter_add_release(reinterpret_cast<int*>(p.pair_counters) + b * p.heads_k + hk,
                            min(max(m_end - m0 - 64 * (wg - 1), 0), 64));
    } else {
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (tid == 0)
        counter_add_release(reinterpret_cast<int*>(p.pair_counters) + b * p.heads_k + hk,
                            m_end - m0);
    }
  }
#endif
}

// Key tile and K/V ring depth of the λ-only pass and of the λ + dQ pass. With dQ at d = 128,
// 64-key tiles: the two dQ accumulators (128 registers) and S, dP (32 + 32) then fit in 240. At
// d = 64 the accumulators take 64 registers, and 96-key tiles (S, dP 48 + 48) compile without
// spill; 128-key tiles spill 4 bytes (ptxas, session 8).
template <int kHeadDim, bool kDq> struct LambdaTiles;
template <> struct LambdaTiles<64, false> { static constexpr int kBlockN = 128, kStages = 2; };
// (d = 64 with dQ: 96-key tiles measured 3-9% faster for this pass than 64-key ones, N = 2k-16k,
// causal or not; 128-key ones 4-6% slower: NOTES.md session 8, GPROJ_BWD_VARIANT 7 and 8.)
template <> struct LambdaTiles<64, true> { static constexpr int kBlockN = 96, kStages = 3; };
template <> struct LambdaTiles<128, false> { static constexpr int kBlockN = 128, kStages = 2; };
template <> struct LambdaTiles<128, true> { static constexpr int kBlockN = 64, kStages = 3; };
// d = 256 (λ only): 64-key tiles in one stage, 192 KB of smem, measured 2-3% faster over the whole
// gproj backward than 32-key tiles in two stages (GPROJ_BWD_VARIANT=7; NOTES.md session 10): the
// S and dP GEMMs are m64n64 instead of m64n32, whose shared-memory reads per flop are higher.
template <bool kDq> struct LambdaTiles<256, kDq> { static constexpr int kBlockN = 64, kStages = 1; };

// kDq: the λ pre-pass alone (rowstate) or, in the full backward, λ and dQ (rowstate and p.dq).
// kBlockNOverride > 0: key tiles of that width instead, in kStagesOverride stages (A/B variants).
template <typename T, int kHeadDim, bool kDq = false, int kBlockNOverride = 0,
          int kStagesOverride = 0>
void run_lambda_prepass(const AttnParams& p, int total_q, int total_k) {
  using Tiles = LambdaTiles<kHeadDim, kDq>;
  constexpr int kBlockN = kBlockNOverride > 0 ? kBlockNOverride : Tiles::kBlockN;
  constexpr int kStages = kStagesOverride > 0 ? kStagesOverride : Tiles::kStages;
  using Traits = LambdaTraits<T, kHeadDim, kBlockN, kStages, kDq>;
  const bool varlen = p.cu_seqlens_q != 0;
  LambdaKernelParams<Traits> prm;
  set_tma_extents(prm, p, total_q, total_k);
  prm.tma_q = make_tma_q<Traits>(p.q, prm.rows_q, p.heads, prm.batch_q, p.q_stride, varlen);
  prm.tma_do = make_tma_q<Traits>(p.dout, prm.rows_q, p.heads, prm.batch_q, p.do_stride, varlen);
  prm.tma_k = make_tma_kv<Traits>(p.k, prm.rows_k, p.heads_k, prm.batch_q, p.k_stride, varlen);
  prm.tma_kc = p.k_centered ? make_tma_kv<Traits>(p.k_centered, prm.rows_k, p.heads_k, prm.batch_q,
                                                  p.kc_stride, varlen)
                            : prm.tma_k;
  prm.tma_v = make_tma_kv<Traits>(p.v, prm.rows_k, p.heads_k, prm.batch_q, p.v_stride, varlen);
  auto kernel = lambda_sm90_kernel<Traits>;
  const int smem = Traits::kSmemBytes;
  const int tiles = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  if (tiles == 0) return;
  dim3 grid;
  if (!slot_grid(prm.p, Traits::kBlockM, total_q, p.heads, grid))
    grid = tile_grid(prm.p, tiles, p.heads, p.batch);
  launch_sm90(kernel, grid, Traits::kNumThreads, smem, prm, p,
              kDq ? "lambda and dQ pass (sm90)" : "lambda pre-pass (sm90)");
}

}  // namespace sm90
}  // namespace gproj
