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
// The KV-outer pass's epilogue writes the fp32 dK (p.dk_unprojected) and, per block of keys,
// Σ_j dK_j (head dim values) and Σ_j ||dK_j|| in fp64 (p.dk_keysum); dk_project_kernel sums the
// blocks in order, projects, and rounds once into p.dk (and, if the caller asked for it, writes
// the projected fp32 dK into p.dk_accum: the value the SPEC's bar is measured on). One read of
// the fp32 dK, one bf16 write: ~50 µs at 16k tokens x 16 kv heads x d = 128. Bitwise
// reproducible: every sum has a fixed order.
#pragma once
#include <cuda_runtime.h>

#include "../api/params.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/tile.cuh"

namespace gproj {

constexpr int kProjectRows = 128;  // keys per block of dk_project_kernel
constexpr int kProjectWarps = 4;   // 32 keys per warp

// Blocks of keys per (sequence, kv head) that p.dk_keysum has room for: one per 64 keys of the
// longest sequence, the smallest KV-outer block (gproj_cuda/ops.py allocates it so).
__host__ __device__ inline int dk_keysum_blocks(const AttnParams& p) { return (p.seqlen_k + 63) / 64; }

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

// Grid: (ceil(seqlen_k / kProjectRows), heads_k, batch); each block sums the sequence's key
// sums (one per KV-outer block of kv_block_keys keys; a few KB from L2) and projects its own
// kProjectRows keys.
template <typename T, int D>
__global__ void __launch_bounds__(32 * kProjectWarps, 8)
    dk_project_kernel(const AttnParams p, int kv_block_keys) {
  constexpr int V = D / 32;
  const int chunk = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const SeqBounds seq(p, b);
  if (chunk * kProjectRows >= seq.nk) return;  // uniform for the block
  __shared__ double total[D + 1];               // Σ_j dK_j, then Σ_j ||dK_j||
  const double* sums = reinterpret_cast<const double*>(p.dk_keysum) +
                       (int64_t(b) * p.heads_k + hk) * dk_keysum_blocks(p) * (D + 1);
  const int blocks = (seq.nk + kv_block_keys - 1) / kv_block_keys;
  for (int t = threadIdx.x; t <= D; t += blockDim.x) {
    double s = 0.0;
    for (int c = 0; c < blocks; ++c) s += sums[int64_t(c) * (D + 1) + t];
    total[t] = s;
  }
  __syncthreads();
  const double inv_norms = total[D] > 0.0 ? 1.0 / total[D] : 0.0;
  const int64_t off = b * p.dk_stride[0] + int64_t(seq.k_start) * p.dk_stride[1] + hk * p.dk_stride[2];
  const float* in = reinterpret_cast<const float*>(p.dk_unprojected) + off;
  float* acc = p.dk_accum ? reinterpret_cast<float*>(p.dk_accum) + off : nullptr;  // may be `in`
  T* dk = reinterpret_cast<T*>(p.dk) + off;
  const int j0 = chunk * kProjectRows + warp * 32;
  for (int j = j0; j < min(j0 + 32, seq.nk); ++j) {
    const int64_t row = int64_t(j) * p.dk_stride[1] + V * lane;
    float x[V];
    const double w = double(load_key_row<D>(in + int64_t(j) * p.dk_stride[1], lane, x)) * inv_norms;
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = float(double(x[e]) - w * total[V * lane + e]);
    if constexpr (V == 4) {
      *reinterpret_cast<uint2*>(dk + row) = make_uint2(pack2<T>(x[0], x[1]), pack2<T>(x[2], x[3]));
      if (acc) *reinterpret_cast<float4*>(acc + row) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
      *reinterpret_cast<uint32_t*>(dk + row) = pack2<T>(x[0], x[1]);
      if (acc) *reinterpret_cast<float2*>(acc + row) = make_float2(x[0], x[1]);
    }
  }
}

// After the KV-outer pass whose blocks hold kv_block_keys keys each.
template <typename T, int D>
void launch_dk_project(const AttnParams& p, int kv_block_keys) {
  const dim3 grid((p.seqlen_k + kProjectRows - 1) / kProjectRows, p.heads_k, p.batch);
  if (grid.x == 0) return;
  dk_project_kernel<T, D><<<grid, 32 * kProjectWarps, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(
      p, kv_block_keys);
  check_cuda(cudaGetLastError(), "backward dK projection");
}

}  // namespace gproj
