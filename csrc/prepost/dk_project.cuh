// The zero-sum projection of gproj's dK (after the Hopper KV-outer pass with A in one part).
//
// Why: the KV-outer pass feeds A = dS~ - lambda P~ (fp32, every row sums to zero to fp32
// rounding) to the dK GEMM rounded once to 16 bits. That rounding is unbiased and leaves each
// dK_j as accurate as two rounded parts do (CPU emulator, SPEC grid: worst median dK error
// 0.175-0.238% either way), but the rows of the rounded A no longer sum to zero exactly, and
// Σ_j dK_j, which softmax makes exactly 0, keeps ~2^-9 of |A||Q'|: up to 50x the SPEC's 1e-5.
// Instead of a second GEMM for A's low part, the gradient is projected back onto the law:
//
//     dK_j <- dK_j - w_j Σ_k dK_k,      w_j = ||dK_j|| / Σ_k ||dK_k||      (per sequence, kv head)
//
// The weights follow each key's own gradient: a key no query attends to keeps its (near) zero
// gradient, and every key moves by the same fraction of its norm, |Σ_k dK_k| / Σ_k ||dK_k|| (the
// residual the bar measures, ≤ 5e-4 here), far below one bf16 rounding (2^-9). Uniform weights
// failed the per-key bar (a key with a tiny gradient received the whole mean; NOTES.md session 7).
//
//   dk_keysum_kernel: per chunk of kKeysumRows keys, Σ_j dK_j (head dim values) and Σ_j ||dK_j||
//                     into p.dk_keysum (fp64), in a fixed order;
//   dk_project_kernel: sums the chunks in order, projects dK (fp32, p.dk_accum, in place: the
//                     value before the final rounding) and rounds it once into p.dk.
// Both read fp32 dK once (memory-bound: ~0.1 ms at N = 16k, 16 kv heads, d = 128). Bitwise
// reproducible: every sum has a fixed order.
#pragma once
#include <cuda_runtime.h>

#include "../api/params.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/tile.cuh"

namespace gproj {

constexpr int kKeysumRows = 128;   // keys per chunk (gproj_cuda/ops.py allocates p.dk_keysum so)
constexpr int kKeysumWarps = 4;    // 32 keys per warp

// One key's fp32 dK row: lane l holds columns [l V, l V + V). Returns ||row|| (the same value in
// every lane: the xor butterfly adds the same pairs in every lane).
template <int D>
__device__ __forceinline__ float load_key_row(const float* row, int lane, float (&x)[D / 32]) {
  constexpr int V = D / 32;
  static_assert(V == 2 || V == 4, "head dim 64 or 128");
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(row + 4 * lane);
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  } else {
    const float2 t = *reinterpret_cast<const float2*>(row + 2 * lane);
    x[0] = t.x, x[1] = t.y;
  }
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < V; ++e) ss = fmaf(x[e], x[e], ss);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
  return sqrtf(ss);
}

__device__ __forceinline__ int keysum_chunks(const AttnParams& p) {
  return (p.seqlen_k + kKeysumRows - 1) / kKeysumRows;
}

// Grid: (keysum_chunks, heads_k, batch).
template <int D>
__global__ void __launch_bounds__(32 * kKeysumWarps, 8) dk_keysum_kernel(const AttnParams p) {
  constexpr int V = D / 32;
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const SeqBounds seq(p, b);
  const float* dk = reinterpret_cast<const float*>(p.dk_accum) + b * p.dk_stride[0] +
                    int64_t(seq.k_start) * p.dk_stride[1] + hk * p.dk_stride[2];
  double col[V] = {}, norms = 0.0;
  const int j0 = chunk * kKeysumRows + warp * 32;
  for (int j = j0; j < min(j0 + 32, seq.nk); ++j) {
    float x[V];
    norms += load_key_row<D>(dk + int64_t(j) * p.dk_stride[1], lane, x);
#pragma unroll
    for (int e = 0; e < V; ++e) col[e] += x[e];
  }
  __shared__ double part[kKeysumWarps][D + 1];
#pragma unroll
  for (int e = 0; e < V; ++e) part[warp][V * lane + e] = col[e];
  if (lane == 0) part[warp][D] = norms;
  __syncthreads();
  double* out = reinterpret_cast<double*>(p.dk_keysum) +
                ((int64_t(b) * p.heads_k + hk) * keysum_chunks(p) + chunk) * (D + 1);
  for (int t = threadIdx.x; t <= D; t += blockDim.x) {
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < kKeysumWarps; ++w) s += part[w][t];
    out[t] = s;
  }
}

// Grid: (keysum_chunks, heads_k, batch); each block sums the whole sequence's chunks (a few KB
// from L2) and projects its own chunk of keys.
template <typename T, int D>
__global__ void __launch_bounds__(32 * kKeysumWarps, 8) dk_project_kernel(const AttnParams p) {
  constexpr int V = D / 32;
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const SeqBounds seq(p, b);
  if (chunk * kKeysumRows >= seq.nk) return;  // uniform for the block
  __shared__ double total[D + 1];              // Σ_j dK_j, then Σ_j ||dK_j||
  const double* sums = reinterpret_cast<const double*>(p.dk_keysum) +
                       (int64_t(b) * p.heads_k + hk) * keysum_chunks(p) * (D + 1);
  const int chunks = (seq.nk + kKeysumRows - 1) / kKeysumRows;
  for (int t = threadIdx.x; t <= D; t += blockDim.x) {
    double s = 0.0;
    for (int c = 0; c < chunks; ++c) s += sums[int64_t(c) * (D + 1) + t];
    total[t] = s;
  }
  __syncthreads();
  const double inv_norms = total[D] > 0.0 ? 1.0 / total[D] : 0.0;
  const int64_t off = b * p.dk_stride[0] + int64_t(seq.k_start) * p.dk_stride[1] + hk * p.dk_stride[2];
  float* acc = reinterpret_cast<float*>(p.dk_accum) + off;
  T* dk = reinterpret_cast<T*>(p.dk) + off;
  const int j0 = chunk * kKeysumRows + warp * 32;
  for (int j = j0; j < min(j0 + 32, seq.nk); ++j) {
    float x[V];
    const double w = double(load_key_row<D>(acc + int64_t(j) * p.dk_stride[1], lane, x)) * inv_norms;
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = float(double(x[e]) - w * total[V * lane + e]);
    float* ra = acc + int64_t(j) * p.dk_stride[1] + V * lane;
    T* rk = dk + int64_t(j) * p.dk_stride[1] + V * lane;
    if constexpr (V == 4) {
      *reinterpret_cast<float4*>(ra) = make_float4(x[0], x[1], x[2], x[3]);
      *reinterpret_cast<uint2*>(rk) = make_uint2(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]));
    } else {
      *reinterpret_cast<float2*>(ra) = make_float2(x[0], x[1]);
      *reinterpret_cast<uint32_t*>(rk) = pack2<T>(x[0], x[1]);
    }
  }
}

template <typename T, int D>
void launch_dk_project(const AttnParams& p) {
  const dim3 grid((p.seqlen_k + kKeysumRows - 1) / kKeysumRows, p.heads_k, p.batch);
  if (grid.x == 0) return;
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  dk_keysum_kernel<D><<<grid, 32 * kKeysumWarps, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "backward dK key sums");
  dk_project_kernel<T, D><<<grid, 32 * kKeysumWarps, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "backward dK projection");
}

}  // namespace gproj
