// Pre- and post-processing of the Hopper KV-outer backward (bwd_kv_sm90.cuh):
//   delta_kernel:     rowstate = {delta, 0, 0, 0}, delta_i = Σ_d dO_id O_id in fp32 (fa3 mode;
//                     gproj gets delta together with lambda from the λ pre-pass);
//   dq_finish_kernel: dQ = alpha * dq_accum rounded once to the input dtype (the KV-outer pass
//                     adds each key tile's dS~ K, gproj: dS~ K - lambda_hi P~ K, into dq_accum
//                     in fp32; tiled layout: tile.cuh).
// Both are memory-bound.
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

// dQ = alpha * dq_accum rounded once to the input dtype. dq_accum is tiled (tile.cuh,
// dq_accum_tiles): one block per (64-row tile, head, sequence) reads its tile with float4 loads and
// writes each lane's value pairs (adjacent columns) as 32-bit stores.
template <typename T, int D>
__global__ void __launch_bounds__(256) dq_finish_kernel(const AttnParams p) {
  const int mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq(p, b);
  if (mb * 64 >= seq.nq) return;
  const float* acc = reinterpret_cast<const float*>(p.dq_accum) +
                     (int64_t(h) * dq_accum_tiles(p) + dq_tile_base(p, b, seq.q_start) + mb) * (64 * D);
  T* dq = reinterpret_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
  for (int idx = 4 * threadIdx.x; idx < 64 * D; idx += 4 * 256) {
    const float4 x = *reinterpret_cast<const float4*>(acc + idx);
    const float v[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int e = 0; e < 4; e += 2) {  // values e, e + 1: one row, adjacent columns
      int row, col;
      dq_accum_coord(idx + e, D, row, col);
      const int i = mb * 64 + row;
      if (i < seq.nq)
        *reinterpret_cast<uint32_t*>(dq + int64_t(seq.q_start + i) * p.dq_stride[1] + col) =
            pack2<T>(__fmul_rn(p.softmax_scale, v[e]), __fmul_rn(p.softmax_scale, v[e + 1]));
    }
  }
}

template <typename T, int D>
void launch_delta(const AttnParams& p) {
  const dim3 grid((p.seqlen_q + kPrepostWarps - 1) / kPrepostWarps, p.heads, p.batch);
  if (grid.x == 0) return;
  delta_kernel<T, D><<<grid, 32 * kPrepostWarps, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p);
  check_cuda(cudaGetLastError(), "backward delta pre-pass");
}

template <typename T, int D>
void launch_dq_finish(const AttnParams& p) {
  const dim3 grid((p.seqlen_q + 63) / 64, p.heads, p.batch);
  if (grid.x == 0) return;
  dq_finish_kernel<T, D><<<grid, 256, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(p);
  check_cuda(cudaGetLastError(), "backward dQ finish");
}

}  // namespace gproj
