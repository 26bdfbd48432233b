// The Hopper (sm_90a) KV-outer backward pass: TMA + WGMMA, warp-specialized (issue 7).
// EXPERIMENTAL: fa3 numerics, head dim 128, reachable through backward_passes = 8 (C API) or
// GPROJ_HOPPER_BWD=1 (Python); everything else takes the mma.sync passes.
//
// One block = 128 keys of one (sequence, kv head). K and V stay in shared memory; the block walks
// every query head of its GQA group and every 64-row query tile that sees its keys, and a
// producer warpgroup streams Q and dO tiles by TMA through a 2-stage mbarrier ring. Two consumer
// warpgroups own 64 keys each. Per query tile (transposed, rows are keys):
//   S^T  = K Q^T, dP^T = V dO^T            WGMMA, both operands in shared memory
//   P^T from the saved softmax state, dS^T = P^T (dP^T - delta)          registers, fp32
//   dV  += P~^T dO,  dK += dS~^T Q          WGMMA, A (P~, dS~) straight from registers
//   dQ   = dS~ K                            WGMMA from shared memory (dS~ written there by both
//                                           warpgroups; each computes half of the head dim)
//   dq_accum += dQ                          fp32 atomics (order varies: not deterministic)
// 5 GEMM-equivalents per (query tile, key tile), as FlashAttention-3. dK and dV of a key are
// summed over the whole group inside one block (no atomics); dQ = alpha dq_accum is rounded once
// by dq_finish_kernel. delta comes from delta_kernel (bwd_prepost.cuh).
#pragma once

#include "../backward/bwd_common.cuh"
#include "../forward/fwd_sm90.cuh"

namespace gproj {
namespace sm90 {

template <typename T_, int kHeadDim_>
struct BwdKvTraits {
  using T = T_;
  using Element = typename CuteElement<T_>::type;
  static constexpr int kHeadDim = kHeadDim_, kBlockN = 128, kBlockM = 64, kStages = 2;
  static constexpr int kNumMmaThreads = 256, kNumThreads = kNumMmaThreads + 128;
  using HD = Int<kHeadDim>;
  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  // Q and dO tiles (query rows x head dim, K-major for S^T / dP^T), kStages deep.
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BM, HD>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<BM, HD, Int<kStages>>{}));
  // ... and as the B operand of dK / dV: (head dim, query rows), head dim contiguous (MN-major).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HD, BM, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K and V (key rows x head dim), resident; K also as dQ's B operand (head dim, keys).
  using SmemAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BN, HD>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<BN, HD>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_ordered_layout(Shape<HD, BN>{}, Step<_2, _1>{})));
  // dS~ as dQ's A operand (query rows x keys), query rows contiguous; double buffered so one
  // barrier per tile separates the writes of tile t+1 from the dQ GEMM reads of tile t.
  using SmemAtomDS = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                              GMMA::Major::MN, Element, BM, BN>());
  using SmemLayoutDS = decltype(tile_to_shape(SmemAtomDS{}, Shape<BM, BN, _2>{}));

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BM, HD>>(),
      Layout<Shape<_2, _1, _1>>{}));  // warpgroups split the keys
  using TiledMmaKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, HD, BM>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_2, _1, _1>>{}));
  using TiledMmaDQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, BN>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, _2, _1>>{}));  // warpgroups split the head dim

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  using TmaQ = TmaLoad<Element, decltype(take<0, 2>(SmemLayoutQ{})), Shape<BM, HD>>;
  using TmaK = TmaLoad<Element, SmemLayoutK, Shape<BN, HD>>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    float2 rows[2][kBlockM];  // per query tile (double buffered): {fa3 lse2, delta}
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) typename Pipeline::SharedStorage pipe_q;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
};

template <class Traits>
struct BwdKvParams {
  typename Traits::TmaQ tma_q, tma_do;
  typename Traits::TmaK tma_k, tma_v;
  int rows_q, rows_k, batch_q;
  AttnParams p;
};

// Named barrier of the two consumer warpgroups (ids 8-9 are the forward's pingpong turns).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 10, 256;\n" ::: "memory");
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kv_sm90_kernel(CUTE_GRID_CONSTANT BwdKvParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  const AttnParams& p = prm.p;

  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.nk) return;  // uniform for the block, before any barrier
  const int n_end = min(n0 + kBlockN, seq.nk);
  const int group = p.heads / p.heads_k;
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
  int m_lo, m_hi;
  mask.query_range(n0, n_end, m_lo, m_hi);
  const int mb_min = m_lo / kBlockM;
  const int mb_max = m_hi > m_lo ? (m_hi + kBlockM - 1) / kBlockM : mb_min;
  const int tiles_per_head = mb_max - mb_min;
  const int n_items = tiles_per_head * group;  // (query head, query tile) pairs, in order
  const float c = p.softmax_scale * 1.4426950408889634f;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename Pipeline::Params pp;
  pp.transaction_bytes = 2 * kBlockM * kHeadDim * int(sizeof(Element));  // Q and dO
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
  Tensor sDS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutDS{});
  const int bq = p.cu_seqlens_q ? 0 : b;

  if (wg == 0) {
    // ---------------- producer: K, V once; Q, dO per query tile ----------------
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
      PipelineState wr = cutlass::make_producer_start_state<Pipeline>();
      for (int it = 0; it < n_items; ++it) {
        const int h = hk * group + it / tiles_per_head, mb = mb_min + it % tiles_per_head;
        Tensor mQ = tma_rows(prm.tma_q, prm.rows_q, kHeadDim, p.heads, prm.batch_q, seq.q_start, h, bq);
        Tensor mDO = tma_rows(prm.tma_do, prm.rows_q, kHeadDim, p.heads, prm.batch_q, seq.q_start, h, bq);
        auto [tQg, tQs] = tma_partition(prm.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ),
                                        group_modes<0, 2>(local_tile(mQ, tile_q, make_coord(_, _0{}))));
        auto [tDg, tDs] = tma_partition(prm.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sDO),
                                        group_modes<0, 2>(local_tile(mDO, tile_q, make_coord(_, _0{}))));
        pipe_q.producer_acquire(wr);
        copy(prm.tma_q.with(*pipe_q.producer_get_barrier(wr), 0), tQg(_, mb), tQs(_, wr.index()));
        copy(prm.tma_do.with(*pipe_q.producer_get_barrier(wr), 0), tDg(_, mb), tDs(_, wr.index()));
        ++wr;
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<240>();
  const int tid = threadIdx.x - 128;
  const int consumer = wg - 1;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaKV mma_kv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_kv = mma_kv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tSrK = thr_sdp.partition_fragment_A(sK);
  Tensor tSrV = thr_sdp.partition_fragment_A(sV);
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);
  Tensor tSrDO = thr_sdp.partition_fragment_B(sDO);
  Tensor tKVrQt = thr_kv.partition_fragment_B(sQt);
  Tensor tKVrDOt = thr_kv.partition_fragment_B(sDOt);
  Tensor tDQrDS = thr_dq.partition_fragment_A(sDS);
  Tensor tDQrKt = thr_dq.partition_fragment_B(sKt);

  auto shape_s = Shape<Int<kBlockN>, Int<kBlockM>>{};  // (keys, queries)
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(shape_s));
  Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(tdKrdK);
  clear(tdVrdV);
  Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));

  // Softmax state and delta of item `it`'s query rows into ss.rows[it & 1] (threads 0..63).
  auto load_rows = [&](int it) {
    if (tid < kBlockM && it < n_items) {
      const int h = hk * group + it / tiles_per_head, mb = mb_min + it % tiles_per_head;
      const int i = mb * kBlockM + tid;
      float2 r = make_float2(INFINITY, 0.f);  // rows past the end: p = 0
      if (i < seq.nq) {
        const int64_t idx = rowstat_index(p, b, h, seq.q_start + i);
        const RowSoftmax rs = load_row_softmax(reinterpret_cast<const float2*>(p.stats)[idx], c);
        r = make_float2(rs.lse2, reinterpret_cast<const float4*>(p.rowstate)[idx].x);
      }
      ss.rows[it & 1][tid] = r;
    }
  };

  if (n_items > 0) {
    load_rows(0);
    consumers_sync();
    ss.barrier_kv.wait(0);
    PipelineState rd;
    for (int it = 0; it < n_items; ++it) {
      const int h = hk * group + it / tiles_per_head, mb = mb_min + it % tiles_per_head;
      const int i0 = mb * kBlockM;
      Tensor tSrS = partition_fragment_C(mma_sdp, shape_s);
      Tensor tSrDP = partition_fragment_C(mma_sdp, shape_s);
      pipe_q.consumer_wait(rd);
      wg_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, rd.index()), tSrS);
      wg_gemm<true>(mma_sdp, tSrV, tSrDO(_, _, _, rd.index()), tSrDP);
      load_rows(it + 1);  // published by this tile's consumers_sync below
      warpgroup_wait<0>();

      // P^T and dS^T in place (fp32), with FA3's arithmetic: p = exp2(fma(s, c, -lse2)).
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor dp_rc = make_tensor(tSrDP.data(), acc_rowcol(tSrDP.layout()));
      const bool partial = mask.tile_partial(i0, i0 + kBlockM, n0, n0 + kBlockN);
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s_rc); ++j) {
        const int qi = get<1>(c_rc(0, j));
        const float2 row = ss.rows[it & 1][qi];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < size<0>(s_rc); ++r) {
          const bool vis = !partial || mask.visible(i0 + qi, n0 + get<0>(c_rc(r, j)));
          const float pv = vis ? exp2_approx(fmaf(s_rc(r, j), c, -row.x)) : 0.f;
          s_rc(r, j) = pv;
          dp_rc(r, j) = pv * (dp_rc(r, j) - row.y);
        }
      }
      // Rounded once: the A operands of dV and dK, and dS~ for dQ (the same values).
      Tensor tOrP = make_tensor_like<Element>(tSrS);
      Tensor tOrDS = make_tensor_like<Element>(tSrDP);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        tOrP(i) = static_cast<Element>(tSrS(i));
        tOrDS(i) = static_cast<Element>(tSrDP(i));
      }
      Tensor tOrPa = make_tensor(tOrP.data(), acc_to_a_layout(tSrS.layout()));
      Tensor tOrDSa = make_tensor(tOrDS.data(), acc_to_a_layout(tSrDP.layout()));
      wg_gemm<false>(mma_kv, tOrPa, tKVrDOt(_, _, _, rd.index()), tdVrdV);
      wg_gemm<false>(mma_kv, tOrDSa, tKVrQt(_, _, _, rd.index()), tdKrdK);

      // dS~ into shared memory as (query, key) for the dQ GEMM. Accumulator elements i, i+1 are
      // adjacent queries of one key, adjacent in this query-contiguous layout too (the swizzle
      // moves 16-byte chunks): one 32-bit store per pair.
      Tensor sDSb = sDS(_, _, it & 1);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tOrDS); i += 2) {
        Element pair[2] = {tOrDS(i), tOrDS(i + 1)};
        *reinterpret_cast<uint32_t*>(&sDSb(get<1>(tScS(i)), get<0>(tScS(i)))) =
            *reinterpret_cast<uint32_t*>(pair);
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> WGMMA reads
      consumers_sync();
      Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<kHeadDim>>{});
      wg_gemm<true>(mma_dq, tDQrDS(_, _, _, it & 1), tDQrKt, tdQrdQ);
      warpgroup_wait<0>();
      pipe_q.consumer_release(rd);
      ++rd;

      // dq_accum += dS~ K (unscaled; rows past the end dropped).
      float* acc = reinterpret_cast<float*>(p.dq_accum) + b * p.dq_stride[0] + h * p.dq_stride[2];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tdQrdQ); i += 2) {
        const int qi = get<0>(tdQcdQ(i)), col = get<1>(tdQcdQ(i));
        if (i0 + qi < seq.nq) {
          float2* dst = reinterpret_cast<float2*>(
              acc + int64_t(seq.q_start + i0 + qi) * p.dq_stride[1] + col);
          atomicAdd(dst, make_float2(tdQrdQ(i), tdQrdQ(i + 1)));
        }
      }
    }
  }
  (void)consumer;

  // ---------------- epilogue: dK = alpha dK, dV, rows past the end dropped ----------------
  Tensor tdKcdK = thr_kv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  const int64_t k_row0 = seq.k_start + n0;
  T* gDK = reinterpret_cast<T*>(p.dk) + b * p.dk_stride[0] + k_row0 * p.dk_stride[1] + hk * p.dk_stride[2];
  T* gDV = reinterpret_cast<T*>(p.dv) + b * p.dv_stride[0] + k_row0 * p.dv_stride[1] + hk * p.dv_stride[2];
  float* gDKacc = p.dk_accum ? reinterpret_cast<float*>(p.dk_accum) + b * p.dk_stride[0] +
                                   k_row0 * p.dk_stride[1] + hk * p.dk_stride[2]
                             : nullptr;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(tdKrdK); i += 2) {
    const int j = get<0>(tdKcdK(i)), col = get<1>(tdKcdK(i));
    if (n0 + j >= n_end) continue;
    const float k0 = p.softmax_scale * tdKrdK(i), k1 = p.softmax_scale * tdKrdK(i + 1);
    *reinterpret_cast<uint32_t*>(gDK + int64_t(j) * p.dk_stride[1] + col) = pack2<T>(k0, k1);
    *reinterpret_cast<uint32_t*>(gDV + int64_t(j) * p.dv_stride[1] + col) =
        pack2<T>(tdVrdV(i), tdVrdV(i + 1));
    if (gDKacc)
      *reinterpret_cast<float2*>(gDKacc + int64_t(j) * p.dk_stride[1] + col) = make_float2(k0, k1);
  }
#endif
}

template <typename T, int kHeadDim>
void run_bwd_kv(const AttnParams& p, int total_q, int total_k) {
  using Traits = BwdKvTraits<T, kHeadDim>;
  const bool varlen = p.cu_seqlens_q != 0;
  BwdKvParams<Traits> prm;
  prm.p = p;
  prm.rows_q = varlen ? total_q : p.seqlen_q;
  prm.rows_k = varlen ? total_k : p.seqlen_k;
  prm.batch_q = varlen ? 1 : p.batch;
  using E = typename Traits::Element;
  auto tile_q = Shape<Int<Traits::kBlockM>, Int<kHeadDim>>{};
  auto tile_k = Shape<Int<Traits::kBlockN>, Int<kHeadDim>>{};
  auto q_smem = take<0, 2>(typename Traits::SmemLayoutQ{});
  prm.tma_q = make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(p.q, prm.rows_q, kHeadDim, p.heads, prm.batch_q, p.q_stride, varlen), q_smem, tile_q, _1{});
  prm.tma_do = make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(p.dout, prm.rows_q, kHeadDim, p.heads, prm.batch_q, p.do_stride, varlen), q_smem, tile_q, _1{});
  prm.tma_k = make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(p.k, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, p.k_stride, varlen), typename Traits::SmemLayoutK{}, tile_k, _1{});
  prm.tma_v = make_tma_copy(SM90_TMA_LOAD{}, tma_gmem<E>(p.v, prm.rows_k, kHeadDim, p.heads_k, prm.batch_q, p.v_stride, varlen), typename Traits::SmemLayoutK{}, tile_k, _1{});
  auto kernel = bwd_kv_sm90_kernel<Traits>;
  const int smem = Traits::kSmemBytes;
  const dim3 grid((p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, p.heads_k, p.batch);
  if (grid.x == 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "KV-outer backward (sm90)");
  kernel<<<grid, Traits::kNumThreads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(prm);
  check_cuda(cudaGetLastError(), "KV-outer backward (sm90)");
}

}  // namespace sm90
}  // namespace gproj
