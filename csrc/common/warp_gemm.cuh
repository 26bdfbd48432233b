// Warp-tile GEMMs on mma.sync m16n8k16 with operands in padded shared memory or registers.
//
// Fragment conventions (PTX ISA, "Matrix fragments for mma.m16n8k16"): a warp owns a 16-row
// tile; accumulator c[nt][0..3] of n-tile nt holds rows (lane/4, lane/4 + 8) and columns
// nt*8 + 2*(lane%4) + {0,1}. Shared-memory tiles are row-major with a row pitch of D + 8
// elements: the 16-byte pad staggers consecutive rows by 4 banks, so every ldmatrix phase
// touches 8 distinct 16-byte bank groups (no conflicts) without a swizzle.
#pragma once
#include "device.cuh"

namespace gproj {

// Row of the accumulator element e (0..3) held by this lane, within the warp's 16 rows.
__device__ __forceinline__ int acc_row(int lane, int e) { return (lane >> 2) + ((e >> 1) << 3); }
// Column of element e of n-tile nt held by this lane.
__device__ __forceinline__ int acc_col(int lane, int nt, int e) {
  return nt * 8 + ((lane & 3) << 1) + (e & 1);
}

// acc[NT] (16 x 8*NT) += A (16 x K, smem row-major [m][k]) * B^T, B stored [n][k] in smem.
// Used for S = Q K^T, dP = dO V^T and their transposes.
template <typename T, int NT, int K>
__device__ __forceinline__ void gemm_ss_nt(float (&acc)[NT][4], const T* sA, int lda, const T* sB,
                                           int ldb, int lane) {
  static_assert(NT % 2 == 0 && K % 16 == 0, "tile shape");
#pragma unroll
  for (int kk = 0; kk < K; kk += 16) {
    uint32_t a[4];
    ldmatrix_x4(a, sA + (lane & 15) * lda + kk + ((lane >> 4) << 3));
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      const int n = nt * 8 + (lane & 7) + ((lane >> 4) << 3);
      const int k = kk + (((lane >> 3) & 1) << 3);
      ldmatrix_x4(b, sB + n * ldb + k);
      mma_16816<T>(acc[nt], a, b[0], b[1]);
      mma_16816<T>(acc[nt + 1], a, b[2], b[3]);
    }
  }
}

// acc[NT] (16 x 8*NT) += A (16 x 16*KT, register fragments) * B, B stored [k][n] in smem.
// Used for O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q with P/dS straight from registers.
template <typename T, int NT, int KT>
__device__ __forceinline__ void gemm_rs_kn(float (&acc)[NT][4], const uint32_t (&a)[KT][4],
                                           const T* sB, int ldb, int lane) {
  static_assert(NT % 2 == 0, "tile shape");
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
      uint32_t b[4];
      const int k = kt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
      const int n = nt * 8 + ((lane >> 4) << 3);
      ldmatrix_x4_trans(b, sB + k * ldb + n);
      mma_16816<T>(acc[nt], a[kt], b[0], b[1]);
      mma_16816<T>(acc[nt + 1], a[kt], b[2], b[3]);
    }
  }
}

// Accumulator tile (16 x 8*NT fp32) -> A-operand fragments (16 x 8*NT of T), rounding each
// value once to nearest even. This is the only place P and dS are rounded.
template <typename T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
  for (int kt = 0; kt < NT / 2; ++kt) {
    a[kt][0] = pack2<T>(c[2 * kt][0], c[2 * kt][1]);
    a[kt][1] = pack2<T>(c[2 * kt][2], c[2 * kt][3]);
    a[kt][2] = pack2<T>(c[2 * kt + 1][0], c[2 * kt + 1][1]);
    a[kt][3] = pack2<T>(c[2 * kt + 1][2], c[2 * kt + 1][3]);
  }
}

// Per-lane sums of the *rounded* values held in A fragments, for the lane's two rows
// (row lane/4 -> sums[0], row lane/4 + 8 -> sums[1]). GProj's r_i and s_i are these, reduced
// over the quad: sums of exactly what the tensor cores consume. Acc = double for sums that are
// later multiplied by a large factor (the dK pass's column sums).
template <typename T, int KT, typename Acc>
__device__ __forceinline__ void add_rounded_row_sums(Acc (&sums)[2], const uint32_t (&a)[KT][4]) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
    const float2 x0 = unpack2<T>(a[kt][0]), x1 = unpack2<T>(a[kt][1]);
    const float2 x2 = unpack2<T>(a[kt][2]), x3 = unpack2<T>(a[kt][3]);
    sums[0] += (Acc(x0.x) + Acc(x0.y)) + (Acc(x2.x) + Acc(x2.y));
    sums[1] += (Acc(x1.x) + Acc(x1.y)) + (Acc(x3.x) + Acc(x3.y));
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

}  // namespace gproj
