// Forward attention, mma.sync class (sm_80+): the correct, complete kernel and the oracle for
// the Hopper pipeline.
//
// One block = BM query rows of one (sequence, head); each warp owns 16 rows and the full head
// dim. Key/value tiles of BN rows stream through shared memory (K of the next tile loads while
// P·V of this one runs, V loads while S of this one runs), with an online softmax.
//
// Numerics (SPEC.md sections 1, 4):
//   gproj: p = exp2((s - m) * c). The raw row max m is subtracted from the raw fp32 score
//          *before* scaling: exact for the maximal element (exp2(0) = 1) and, for the others,
//          rounded relative to the difference rather than to a possibly huge score. Keys arrive
//          centered (centering.py), so s itself carries no common offset.
//   fa3:   p = exp2(fma(s, c, -m * c)), FlashAttention-3's fused form, bug included.
// Both keep fp32 p for the row sum and round P once for the P·V GEMM.
#pragma once
#include "../common/tile.cuh"
#include "../common/warp_gemm.cuh"

namespace gproj {

template <typename T_, int D_, int BM_, int BN_>
struct FwdConfig {
  using T = T_;
  static constexpr int D = D_, BM = BM_, BN = BN_;
  static constexpr int kWarps = BM / 16;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int LD = D + 8;
  static constexpr int kSmemBytes = (BM + 2 * BN) * LD * int(sizeof(T));
};

template <class Cfg, bool kGProj>
__global__ void __launch_bounds__(Cfg::kThreads) fwd_kernel(const AttnParams p) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, LD = Cfg::LD;
  constexpr int NT_S = BN / 8, NT_O = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * LD;
  T* sV = sK + BN * LD;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  const int m0 = m_block * BM;
  if (m0 >= seq.nq) return;
  const int m_end = min(m0 + BM, seq.nq);
  const int hk = h / (p.heads / p.heads_k);
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);

  const T* gQ = reinterpret_cast<const T*>(p.q) + b * p.q_stride[0] +
                int64_t(seq.q_start + m0) * p.q_stride[1] + h * p.q_stride[2];
  const bool kc = reads_centered_keys(p, b, hk);
  const int64_t ks1 = kc ? p.kc_stride[1] : p.k_stride[1];  // K' or the user's K (tile.cuh)
  const T* gK = kc ? reinterpret_cast<const T*>(p.k_centered) + b * p.kc_stride[0] +
                         int64_t(seq.k_start) * ks1 + hk * p.kc_stride[2]
                   : reinterpret_cast<const T*>(p.k) + b * p.k_stride[0] +
                         int64_t(seq.k_start) * ks1 + hk * p.k_stride[2];
  const T* gV = reinterpret_cast<const T*>(p.v) + b * p.v_stride[0] +
                int64_t(seq.k_start) * p.v_stride[1] + hk * p.v_stride[2];

  int nb_min, nb_max;  // key tiles this query tile needs
  mask.key_blocks(m0, m_end, BN, nb_min, nb_max);

  const float c = p.softmax_scale * 1.4426950408889634f;  // scale * log2(e), rounded once

  load_tile<T, BM, D, Cfg::kThreads>(sQ, gQ, p.q_stride[1], m_end - m0, tid);
  if (nb_max > nb_min) {
    const int n0 = (nb_max - 1) * BN;
    load_tile<T, BN, D, Cfg::kThreads>(sK, gK + n0 * ks1, ks1, seq.nk - n0,
                                       tid);
  }
  cp_async_commit();

  float acc_o[NT_O][4];
  zero(acc_o);
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running max of the lane's rows
  float row_sum[2] = {0.f, 0.f};              // lane-partial sums of fp32 p

  // Newest key tile first: the partial (masked) tiles of a causal band come first.
  for (int nb = nb_max - 1; nb >= nb_min; --nb) {
    const int n0 = nb * BN;
    cp_async_wait<0>();
    __syncthreads();  // K(nb) landed; every warp finished P·V of the previous tile (sV free)
    load_tile<T, BN, D, Cfg::kThreads>(sV, gV + n0 * p.v_stride[1], p.v_stride[1], seq.nk - n0,
                                       tid);
    cp_async_commit();

    float s[NT_S][4];
    zero(s);
    gemm_ss_nt<T, NT_S, D>(s, sQ + warp * 16 * LD, LD, sK, LD, lane);

    if (mask.tile_partial(m0, m0 + BM, n0, n0 + BN)) {
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!mask.visible(m0 + warp * 16 + acc_row(lane, e), n0 + acc_col(lane, nt, e)))
            s[nt][e] = -INFINITY;
    }

    // Online softmax for the lane's two rows (a row's 4 lanes form a quad).
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * rr], s[nt][2 * rr + 1]));
      const float m_new = fmaxf(row_max[rr], quad_max(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // row sees no key yet: p = 0
      const float rescale = exp2_approx((row_max[rr] - m_use) * c);
      row_max[rr] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt)
#pragma unroll
        for (int e = 2 * rr; e < 2 * rr + 2; ++e) {
          float x;
          if constexpr (kGProj) {
            x = exp2_approx((s[nt][e] - m_use) * c);
          } else {
            x = exp2_approx(fmaf(s[nt][e], c, -(m_use * c)));
          }
          s[nt][e] = x;
          sum += x;
        }
      row_sum[rr] = row_sum[rr] * rescale + sum;
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt) {
        acc_o[nt][2 * rr] *= rescale;
        acc_o[nt][2 * rr + 1] *= rescale;
      }
    }

    uint32_t pa[NT_S / 2][4];
    acc_to_a<T, NT_S>(pa, s);

    cp_async_wait<0>();
    __syncthreads();  // V(nb) landed; every warp finished S of this tile (sK free)
    if (nb > nb_min) {
      const int n1 = (nb - 1) * BN;
      load_tile<T, BN, D, Cfg::kThreads>(sK, gK + n1 * ks1, ks1,
                                         seq.nk - n1, tid);
    }
    cp_async_commit();
    gemm_rs_kn<T, NT_O, NT_S / 2>(acc_o, pa, sV, LD, lane);
  }

  // ---- epilogue: normalize, store O, LSE and the softmax state for the backward -------------
  const float alpha = p.softmax_scale;
  const T* shift = p.k_shift ? reinterpret_cast<const T*>(p.k_shift) +
                                   (int64_t(b) * p.heads_k + hk) * D
                             : nullptr;
  const int64_t o_off = b * p.o_stride[0] + int64_t(seq.q_start + m0) * p.o_stride[1] +
                        h * p.o_stride[2];
  T* gO = reinterpret_cast<T*>(p.out) + o_off;
  float* gOf = p.out_f32 ? reinterpret_cast<float*>(p.out_f32) + o_off : nullptr;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = warp * 16 + (lane >> 2) + rr * 8;  // row within the tile
    const float l = quad_sum(row_sum[rr]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    // Centered keys: the user's scores are s + q.shift, so lse gains alpha * (q . shift).
    float qshift = 0.f;
    if (shift != nullptr) {
      for (int d = (lane & 3); d < D; d += 4) qshift += to_float(sQ[r * LD + d]) * to_float(shift[d]);
      qshift = quad_sum(qshift);
    }
    if (m0 + r < m_end) {
      const int64_t orow = int64_t(r) * p.o_stride[1];
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt) {
        const int col = acc_col(lane, nt, 0);
        const float o0 = acc_o[nt][2 * rr] * inv, o1 = acc_o[nt][2 * rr + 1] * inv;
        if (gOf) {  // unrounded chunk output (context parallelism merges several)
          *reinterpret_cast<float2*>(gOf + orow + col) = make_float2(o0, o1);
        } else {
          *reinterpret_cast<uint32_t*>(gO + orow + col) = pack2<T>(o0, o1);
        }
      }
      if ((lane & 3) == 0) {
        const int64_t idx = rowstat_index(p, b, h, seq.q_start + m0 + r);
        const bool empty = row_max[rr] == -INFINITY;
        const float log2l = empty ? 0.f : log2f(l);
        const float m_raw = empty ? INFINITY : row_max[rr];
        reinterpret_cast<float2*>(p.stats)[idx] = make_float2(m_raw, log2l);
        const float lse = empty ? INFINITY : (m_raw * c + log2l) * 0.6931471805599453f + alpha * qshift;
        reinterpret_cast<float*>(p.lse)[idx] = lse;
      }
    }
  }
}

}  // namespace gproj
