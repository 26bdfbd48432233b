// Backward pass 1 of 2 (Q-outer): delta, dQ with GProj's first correction, and lambda.
//
// One block = BM query rows of one (sequence, head). Per key tile:
//   S = Q K^T, P (recomputed), dP = dO V^T, dS = P (dP - delta)
//   dS~ = round(dS), P~ = round(P)                         (the values the GEMMs consume)
//   acc_dq += dS~ K;  gproj: acc_pk += P~ K;  r += rowsum(dS~), s += rowsum(P~)   (fp32)
// In gproj mode K is the exactly centered K' (centering.py), and for FP16 inputs the GEMMs run
// on BF16 copies (GradGemmType).
// Epilogue: lambda = r / s (fp64, handed on as two fp32 parts) and
// dQ = alpha (acc_dq - lambda acc_pk), combined in fp32 and never
// re-rounded through dS~ - lambda P~ (SPEC.md section 3). delta and the lambda the KV-outer pass
// needs go to `rowstate`. Deterministic: every dQ row is produced by one block, no atomics.
// With p.partial (context parallelism) the epilogue adds fp32 partials instead (params.h).
//
// Warps: (BM/16) row groups x DSPLIT slices of the head dim. A warp computes S and dP for its
// 16 rows (duplicated across the DSPLIT warps of a row group) and dQ for its D/DSPLIT columns;
// DSPLIT = 2 at head dim 256 keeps the two fp32 accumulators in registers.
#pragma once
#include "../common/tile.cuh"
#include "../common/warp_gemm.cuh"
#include "bwd_common.cuh"

namespace gproj {

template <typename T_, int D_, int BM_, int BN_, int DSPLIT_>
struct BwdDqConfig {
  using T = T_;
  static constexpr int D = D_, BM = BM_, BN = BN_, DSPLIT = DSPLIT_;
  static constexpr int DW = D / DSPLIT;  // dQ columns per warp
  static constexpr int kRowGroups = BM / 16;
  static constexpr int kThreads = kRowGroups * DSPLIT * 32;
  static constexpr int LD = D + 8;
  template <bool kConvert>
  static constexpr int smem_bytes() {
    return (2 * BM + (kConvert ? 3 : 2) * BN) * LD * 2 + BM * int(sizeof(float)) * 4;
  }
};

// Partial epilogue (p.partial, context parallelism): this block's rows have seen one key chunk.
// Add the unscaled fp32 accumulators and the row sums into the caller's buffers; the caller
// forms lambda = r / s and dQ = alpha (dq_accum - lambda pk_accum) after the last chunk, which is
// the same arithmetic as the one-chunk epilogue up to the order of the fp32 additions.
template <class Cfg, bool kGProj, int NT_Q = Cfg::DW / 8>
__device__ __forceinline__ void partial_epilogue(const AttnParams& p, int b, int h,
                                                 int64_t q_row0, int rows, int r0, int wd,
                                                 int lane, const float (&acc_dq)[NT_Q][4],
                                                 const float (&acc_pk)[kGProj ? NT_Q : 1][4],
                                                 const double (&r_sum)[2],
                                                 const double (&s_sum)[2],
                                                 const float (&delta)[2]) {
  float* gDQ = reinterpret_cast<float*>(p.dq_accum) + b * p.dq_stride[0] +
               q_row0 * p.dq_stride[1] + h * p.dq_stride[2];
  float* gPK = kGProj ? reinterpret_cast<float*>(p.pk_accum) + b * p.dq_stride[0] +
                            q_row0 * p.dq_stride[1] + h * p.dq_stride[2]
                      : nullptr;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = r0 + 8 * rr;
    double rs = 0.0, ss = 0.0;
    if constexpr (kGProj) {
      rs = quad_sum(r_sum[rr]);
      ss = quad_sum(s_sum[rr]);
    }
    if (r >= rows) continue;
#pragma unroll
    for (int nt = 0; nt < NT_Q; ++nt) {
      const int64_t off = int64_t(r) * p.dq_stride[1] + wd * Cfg::DW + acc_col(lane, nt, 0);
      float2* d = reinterpret_cast<float2*>(gDQ + off);
      *d = make_float2(d->x + acc_dq[nt][2 * rr], d->y + acc_dq[nt][2 * rr + 1]);
      if constexpr (kGProj) {
        float2* k = reinterpret_cast<float2*>(gPK + off);
        *k = make_float2(k->x + acc_pk[nt][2 * rr], k->y + acc_pk[nt][2 * rr + 1]);
      }
    }
    if (wd == 0 && (lane & 3) == 0) {
      const int64_t idx = rowstat_index(p, b, h, q_row0 + r);
      reinterpret_cast<float4*>(p.rowstate)[idx] = make_float4(delta[rr], 0.f, 0.f, 0.f);
      if constexpr (kGProj) {
        double2* a = reinterpret_cast<double2*>(p.rs_accum) + idx;
        *a = make_double2(a->x + rs, a->y + ss);
      }
    }
  }
}

template <class Cfg, bool kGProj>
__global__ void __launch_bounds__(Cfg::kThreads) bwd_dq_kernel(const AttnParams p) {
  using T = typename Cfg::T;
  using TG = typename GradGemmType<T, kGProj>::type;  // operand type of the gradient GEMMs
  constexpr bool kConvert = !std::is_same<T, TG>::value;
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, LD = Cfg::LD, DW = Cfg::DW;
  constexpr int NT_S = BN / 8, NT_Q = DW / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sDO = sQ + BM * LD;
  T* sK = sDO + BM * LD;
  T* sV = sK + BN * LD;
  TG* sKg = reinterpret_cast<TG*>(sV + BN * LD);  // BF16 copy of K (FP16 gproj), else sK
  float* sDelta = reinterpret_cast<float*>(sKg + (kConvert ? BN * LD : 0));
  if constexpr (!kConvert) sKg = reinterpret_cast<TG*>(sK);
  float* sM = sDelta + BM;
  float* sLog2l = sM + BM;
  float* sLse2 = sLog2l + BM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wrow = warp % Cfg::kRowGroups, wd = warp / Cfg::kRowGroups;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  const int m0 = m_block * BM;
  if (m0 >= seq.nq) return;
  const int m_end = min(m0 + BM, seq.nq);
  const int hk = h / (p.heads / p.heads_k);
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
  const float c = p.softmax_scale * 1.4426950408889634f;

  const int64_t q_row0 = seq.q_start + m0;
  const T* gQ = reinterpret_cast<const T*>(p.q) + b * p.q_stride[0] + q_row0 * p.q_stride[1] +
                h * p.q_stride[2];
  const T* gDO = reinterpret_cast<const T*>(p.dout) + b * p.do_stride[0] +
                 q_row0 * p.do_stride[1] + h * p.do_stride[2];
  const T* gO = reinterpret_cast<const T*>(p.out) + b * p.o_stride[0] + q_row0 * p.o_stride[1] +
                h * p.o_stride[2];
  const T* gK = reinterpret_cast<const T*>(p.k) + b * p.k_stride[0] +
                int64_t(seq.k_start) * p.k_stride[1] + hk * p.k_stride[2];
  const T* gV = reinterpret_cast<const T*>(p.v) + b * p.v_stride[0] +
                int64_t(seq.k_start) * p.v_stride[1] + hk * p.v_stride[2];

  load_tile<T, BM, D, Cfg::kThreads>(sQ, gQ, p.q_stride[1], m_end - m0, tid);
  load_tile<T, BM, D, Cfg::kThreads>(sDO, gDO, p.do_stride[1], m_end - m0, tid);
  cp_async_commit();

  // delta_i = sum_d dO_id O_id (fp32) from the output as stored; rows past the end get the
  // state of a row that sees nothing (p = 0).
  {
    constexpr int kTPR = Cfg::kThreads / BM;  // threads per row (power of two, <= 32)
    const int r = tid / kTPR, part = tid % kTPR;
    float acc = 0.f;
    if (m0 + r < m_end) {
      const T* orow = gO + int64_t(r) * p.o_stride[1];
      const T* dorow = gDO + int64_t(r) * p.do_stride[1];
      for (int d = part; d < D; d += kTPR) acc += to_float(orow[d]) * to_float(dorow[d]);
    }
#pragma unroll
    for (int off = kTPR / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, off);
    if (part == 0) {
      float2 st = make_float2(INFINITY, 0.f);
      if (m0 + r < m_end)
        st = reinterpret_cast<const float2*>(p.stats)[rowstat_index(p, b, h, q_row0 + r)];
      const RowSoftmax rs = load_row_softmax(st, c);
      sDelta[r] = acc;
      sM[r] = rs.m;
      sLog2l[r] = rs.log2l;
      sLse2[r] = rs.lse2;
    }
  }

  int nb_min, nb_max;  // key tiles this query tile needs
  mask.key_blocks(m0, m_end, BN, nb_min, nb_max);

  float acc_dq[NT_Q][4];
  zero(acc_dq);
  float acc_pk[kGProj ? NT_Q : 1][4];
  zero(acc_pk);
  // Row sums of the rounded dS~ and P~: fp32 within a key tile, fp64 across tiles. lambda must
  // remove a leak up to ~100x sum_j |dK_j| to 1e-5 of it (SPEC section 5), i.e. ~2^-31 relative:
  // a running fp32 sum over all tiles (rows of dS nearly cancel, so the partial sums are far
  // larger than r) left sum_j dK_j at 3e-5 on one stress point (emulated: 1e-5 -> 1e-7 with this).
  double r_sum[2] = {0.0, 0.0}, s_sum[2] = {0.0, 0.0};

  // The lane's two rows: tile rows r0, r0 + 8 of its row group.
  const int r0 = wrow * 16 + (lane >> 2);
  RowSoftmax rsm[2];
  float delta[2];

  for (int nb = nb_min; nb < nb_max; ++nb) {
    const int n0 = nb * BN;
    load_tile<T, BN, D, Cfg::kThreads>(sK, gK + n0 * p.k_stride[1], p.k_stride[1], seq.nk - n0,
                                       tid);
    load_tile<T, BN, D, Cfg::kThreads>(sV, gV + n0 * p.v_stride[1], p.v_stride[1], seq.nk - n0,
                                       tid);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (kConvert) {
      convert_tile<TG, T, BN, D, Cfg::kThreads>(sKg, sK, tid);
      __syncthreads();
    }
    if (nb == nb_min) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int r = r0 + 8 * rr;
        rsm[rr] = RowSoftmax{sM[r], sLog2l[r], sLse2[r]};
        delta[rr] = sDelta[r];
      }
    }

    float s[NT_S][4], dp[NT_S][4];
    zero(s);
    zero(dp);
    gemm_ss_nt<T, NT_S, D>(s, sQ + wrow * 16 * LD, LD, sK, LD, lane);
    gemm_ss_nt<T, NT_S, D>(dp, sDO + wrow * 16 * LD, LD, sV, LD, lane);

    // P and dS in place: s <- p, dp <- dS = p (dP - delta).
#pragma unroll
    for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = e >> 1;
        const bool vis = mask.visible(m0 + r0 + 8 * rr, n0 + acc_col(lane, nt, e));
        const float pv = vis ? recompute_p<kGProj>(s[nt][e], rsm[rr], c) : 0.f;
        s[nt][e] = pv;
        dp[nt][e] = pv * (dp[nt][e] - delta[rr]);
      }

    uint32_t dsa[NT_S / 2][4];
    acc_to_a<TG, NT_S>(dsa, dp);
    gemm_rs_kn<TG, NT_Q, NT_S / 2>(acc_dq, dsa, sKg + wd * DW, LD, lane);
    if constexpr (kGProj) {
      uint32_t pa[NT_S / 2][4];
      acc_to_a<TG, NT_S>(pa, s);
      gemm_rs_kn<TG, NT_Q, NT_S / 2>(acc_pk, pa, sKg + wd * DW, LD, lane);
      float r_tile[2] = {0.f, 0.f}, s_tile[2] = {0.f, 0.f};
      add_rounded_row_sums<TG, NT_S / 2>(r_tile, dsa);
      add_rounded_row_sums<TG, NT_S / 2>(s_tile, pa);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) r_sum[rr] += double(r_tile[rr]), s_sum[rr] += double(s_tile[rr]);
    }
    __syncthreads();  // all warps done with sK / sV before the next tile overwrites them
  }
  if (nb_max <= nb_min) {  // no visible key: still need the row state
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) delta[rr] = sDelta[r0 + 8 * rr];
  }

  // ---- epilogue ---------------------------------------------------------------------------
  if (p.partial) {  // context parallelism: add this key chunk's fp32 partials (see params.h)
    partial_epilogue<Cfg, kGProj>(p, b, h, q_row0, m_end - m0, r0, wd, lane, acc_dq, acc_pk,
                                  r_sum, s_sum, delta);
    return;
  }
  const float alpha = p.softmax_scale;
  T* gDQ = reinterpret_cast<T*>(p.dq) + b * p.dq_stride[0] + q_row0 * p.dq_stride[1] +
           h * p.dq_stride[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = r0 + 8 * rr;
    float lam = 0.f, lam_lo = 0.f;
    if constexpr (kGProj) {
      const double rs = quad_sum(r_sum[rr]), ss = quad_sum(s_sum[rr]);
      split_lambda(rs, ss, lam, lam_lo);
    }
    if (m0 + r < m_end) {
      T* row = gDQ + int64_t(r) * p.dq_stride[1] + wd * DW;
#pragma unroll
      for (int nt = 0; nt < NT_Q; ++nt) {
        float x0 = acc_dq[nt][2 * rr], x1 = acc_dq[nt][2 * rr + 1];
        if constexpr (kGProj) {
          x0 -= lam * acc_pk[nt][2 * rr];
          x1 -= lam * acc_pk[nt][2 * rr + 1];
        }
        *reinterpret_cast<uint32_t*>(row + acc_col(lane, nt, 0)) = pack2<T>(alpha * x0, alpha * x1);
      }
      if (wd == 0 && (lane & 3) == 0) {
        const int64_t idx = rowstat_index(p, b, h, q_row0 + r);
        reinterpret_cast<float4*>(p.rowstate)[idx] = make_float4(delta[rr], lam, lam_lo, 0.f);
      }
    }
  }
}

}  // namespace gproj
