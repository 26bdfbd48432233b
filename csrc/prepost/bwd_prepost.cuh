// Pre- and post-processing of the Hopper KV-outer backward (bwd_kv_sm90.cuh):
//   delta_kernel:     rowstate = {delta, 0, 0, 0}, delta_i = Σ_d dO_id O_id in fp32 (fa3 mode;
//                     gproj gets delta together with lambda from the λ pre-pass);
//   dq_finish_kernel: dQ = alpha * dq_accum (gproj: alpha (dq_accum - lambda_hi pk_accum))
//                     rounded once to the input dtype (the KV-outer pass adds each key tile's
//                     dS~ K, P~ K into them in fp32).
// Both are memory-bound: one warp per (row, head).
#pragma once
#include <cuda_runtime.h>

#include "../api/params.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/tile.cuh"

namespace gproj {

constexpr int kPrepostWarps = 8;  // rows per block

// Grid: (ceil(seqlen_q / 8), heads, batch); warp w of block x handles row 8x + w.
template <typename T, int D>
__global__ void __launch_bounds__(32 * kPrepostWarps) delta_kernel(const AttnParams p) {
  const int lane = threadIdx.x & 31, r = blockIdx.x * kPrepostWarps + (threadIdx.x >> 5);
  const int h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  if (r >= seq.nq) return;
  const int64_t row = seq.q_start + r;
  const T* o = reinterpret_cast<const T*>(p.out) + b * p.o_stride[0] + row * p.o_stride[1] +
               h * p.o_stride[2];
  const T* d = reinterpret_cast<const T*>(p.dout) + b * p.do_stride[0] + row * p.do_stride[1] +
               h * p.do_stride[2];
  float acc = 0.f;
  for (int c = 2 * lane; c < D; c += 64) {
    const float2 x = unpack2<T>(*reinterpret_cast<const uint32_t*>(o + c));
    const float2 y = unpack2<T>(*reinterpret_cast<const uint32_t*>(d + c));
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, m);
  if (lane == 0)
    reinterpret_cast<float4*>(p.rowstate)[rowstat_index(p, b, h, int(row))] =
        make_float4(acc, 0.f, 0.f, 0.f);
}

// gproj: dQ = alpha (dS~K - lambda_hi P~K), the two fp32 sums combined once (reference.py's
// order: the product rounded, then the difference, then the scale).
template <typename T, int D, bool kGProj>
__global__ void __launch_bounds__(32 * kPrepostWarps) dq_finish_kernel(const AttnParams p) {
  const int lane = threadIdx.x & 31, r = blockIdx.x * kPrepostWarps + (threadIdx.x >> 5);
  const int h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  if (r >= seq.nq) return;
  const int64_t off = b * p.dq_stride[0] + int64_t(seq.q_start + r) * p.dq_stride[1] +
                      h * p.dq_stride[2];
  const float* acc = reinterpret_cast<const float*>(p.dq_accum) + off;
  T* dq = reinterpret_cast<T*>(p.dq) + off;
  float lam = 0.f;
  const float* pk = nullptr;
  if constexpr (kGProj) {
    lam = reinterpret_cast<const float4*>(p.rowstate)[rowstat_index(p, b, h, seq.q_start + r)].y;
    pk = reinterpret_cast<const float*>(p.pk_accum) + off;
  }
  for (int c = 2 * lane; c < D; c += 64) {
    float2 x = *reinterpret_cast<const float2*>(acc + c);
    if constexpr (kGProj) {
      const float2 y = *reinterpret_cast<const float2*>(pk + c);
      x = make_float2(__fsub_rn(x.x, __fmul_rn(lam, y.x)), __fsub_rn(x.y, __fmul_rn(lam, y.y)));
    }
    *reinterpret_cast<uint32_t*>(dq + c) =
        pack2<T>(__fmul_rn(p.softmax_scale, x.x), __fmul_rn(p.softmax_scale, x.y));
  }
}

template <typename T, int D>
void launch_delta(const AttnParams& p) {
  const dim3 grid((p.seqlen_q + kPrepostWarps - 1) / kPrepostWarps, p.heads, p.batch);
  if (grid.x == 0) return;
  delta_kernel<T, D><<<grid, 32 * kPrepostWarps, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p);
  check_cuda(cudaGetLastError(), "backward delta pre-pass");
}

template <typename T, int D, bool kGProj>
void launch_dq_finish(const AttnParams& p) {
  const dim3 grid((p.seqlen_q + kPrepostWarps - 1) / kPrepostWarps, p.heads, p.batch);
  if (grid.x == 0) return;
  dq_finish_kernel<T, D, kGProj><<<grid, 32 * kPrepostWarps, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p);
  check_cuda(cudaGetLastError(), "backward dQ finish");
}

}  // namespace gproj
