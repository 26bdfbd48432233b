// Pieces both backward passes share: recomputing P from the saved softmax state, and the
// numerics-mode dependent operand type of the KV-outer pass.
#pragma once
#include "../common/device.cuh"

namespace gproj {

// Per-query-row softmax state as the backward needs it.
struct RowSoftmax {
  float m;      // raw score max (+inf for a row that sees no key -> p = 0)
  float log2l;  // log2 of the forward's row sum
  float lse2;   // fa3 mode: FA3's single fp32 log2-sum-exp, m * c + log2l
};

__device__ __forceinline__ RowSoftmax load_row_softmax(const float2 st, float c) {
  RowSoftmax r;
  r.m = st.x;
  r.log2l = st.y;
  r.lse2 = __fadd_rn(__fmul_rn(st.x, c), st.y);  // two roundings, as FA3 stores it
  return r;
}

// Normalized probability of raw score s.
//   gproj: exp2(fma(s - m, c, -log2 l)): the difference to the row max is exact-ish and small,
//          so the subtraction of log2 l (at most log2 N) loses nothing.
//   fa3:   exp2(fma(s, c, -lse2)): one fp32 log-sum-exp per row; with large logits its
//          rounding (an ulp of a large number) scales the whole row.
template <bool kGProj>
__device__ __forceinline__ float recompute_p(float s, const RowSoftmax& r, float c) {
  if constexpr (kGProj) {
    return exp2_approx(fmaf(s - r.m, c, -r.log2l));
  } else {
    return exp2_approx(fmaf(s, c, -r.lse2));
  }
}

// lambda = r / s from the fp64 row sums, as hi + lo fp32 parts (both 0 where s = 0). The dQ
// correction uses hi (its error is relative to dQ); A = dS~ - lambda P~ in the dK/dV pass uses
// both: one fp32 lambda leaves up to 7e-6 of sum_j |dK_j| in sum_j dK_j (emulator, stress grid)
// where the leak it removes is 100x dK, against a 1e-5 bar.
__device__ __forceinline__ void split_lambda(double r, double s, float& hi, float& lo) {
  if (s > 0.0) {
    const double lam = r / s;
    hi = float(lam);
    lo = float(lam - double(hi));
  } else {
    hi = lo = 0.f;
  }
}

// Operand type of the gradient GEMMs (dQ = dS~ K, dK = A^T Q, dV = P~^T dO, corrections).
// FP16 has 5 exponent bits: on the stress grid most keys' p and dS are far below FP16's normal
// range (p ~ 2^-58), so FP16 P~/dS~ flush to zero and dK/dV (and the small terms of very sharp
// dQ rows) lose every bit. gproj mode uses BF16 operands there, with BF16 copies of Q, dO and
// the *centered* K made in shared memory (centering makes that copy round the keys' spread, not
// their mean). S and dP keep the FP16 inputs, so P is exactly the forward's. fa3 mode keeps
// FA3's arithmetic.
template <typename T, bool kGProj>
struct GradGemmType {
  using type = typename std::conditional<kGProj, bf16, T>::type;
};

template <typename TG>
__device__ __forceinline__ float round_to(float x) {
  return to_float(from_float<TG>(x));
}

// Elementwise copy of a ROWS x D smem tile (pitch D + 8) into another element type.
template <typename TD, typename TS, int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void convert_tile(TD* dst, const TS* src, int tid) {
  for (int idx = tid; idx < ROWS * D; idx += NTHREADS) {
    const int r = idx / D, d = idx % D;
    dst[r * (D + 8) + d] = from_float<TD>(to_float(src[r * (D + 8) + d]));
  }
}

}  // namespace gproj
