// Pre- and post-processing of the Hopper KV-outer backward (bwd_kv_sm90.cuh):
//   delta_kernel:     rowstate = {delta, lse2, 0, 0}, delta_i = Σ_d dO_id O_id in fp32 and
//                     lse2 = m c + log2 l, FA3's stored log2-sum-exp, from stats (fa3 mode;
//                     gproj gets delta together with lambda from the λ pre-pass);
//   dq_finish_kernel: dQ = alpha * dq_accum rounded once to the input dtype (the KV-outer pass
//                     adds each key tile's dS~ K, gproj: dS~ K - lambda_hi P~ K, into dq_accum
//                     in fp32; tiled layout: tile.cuh).
// Both are memory-bound. With AttnParams::pair_counters the KV-outer pass is delta_kernel's
// programmatic dependent and dq_finish_kernel the last pass's before it (fa3 mode: the KV-outer
// pass; gproj at d = 256: dK's projection), each block waiting only for its (sequence, kv head)
// pair's counts (pdl.cuh).
#pragma once
#include <cuda_runtime.h>

#include "../api/params.h"
#include "../api/variants.h"
#include "../backward/bwd_common.cuh"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/pdl.cuh"
#include "../common/tile.cuh"

namespace gproj {

// One block per (64-row tile, head, sequence), 256 threads: the dq_accum tile of the same rows is
// one contiguous 64 x D fp32 block (tile.cuh), so the delta pre-pass can also zero-fill it.
constexpr int kPrepostRows = 64, kPrepostThreads = 256;

// delta_i = Σ_d dO_id O_id in fp32, from 16-byte loads: D / 8 lanes per row, each row's partial
// sums reduced over its lane group. With p.dq_accum set (fa3 mode), the tile's dq_accum rows are
// zero-filled here, which saves the caller a memset pass over it (measured 0.03 ms at 16k tokens
// x 2048; bench/NOTES.md session 8); so is fa3 mode's split-group workspace (kv_head_splits,
// zero_split_sums_share). kDqRows: the rows of dq_accum's tiles (tile.cuh; 80 for the 80-row
// pass): block mb zeroes floats [64 mb D, 64 (mb + 1) D) of the sequence's part of a head's
// dq_accum, the sequence's last block everything from there to the end of its last tile
// (ceil(nq / kDqRows) kDqRows D floats: at least the nq D the blocks before reach).
template <typename T, int D, int kDqRows = 64>
__global__ void __launch_bounds__(kPrepostThreads) delta_kernel(const AttnParams p) {
  constexpr int kLanesPerRow = D / 8, kRowsPerPass = kPrepostThreads / kLanesPerRow;
  const GridTile gt = block_tile(p, p.cu_seqlens_q, p.heads);
  const int mb = gt.tile, h = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  if (mb * kPrepostRows >= seq.nq) return;
  // pair_counters: [pair] counts the rows whose delta is written and dq_accum zeroed, for the
  // KV-outer pass launched under this grid's last wave (it may launch once every block started)
  int* rows_done = p.pair_counters ? reinterpret_cast<int*>(p.pair_counters) +
                                         int64_t(b) * p.heads_k + h / (p.heads / p.heads_k)
                                   : nullptr;
  if (rows_done && threadIdx.x == 0) pdl_launch_dependents();
  if (p.dq_accum) {
    float4* acc = reinterpret_cast<float4*>(
        reinterpret_cast<float*>(p.dq_accum) +
        (int64_t(h) * dq_accum_tiles<kDqRows>(p) + dq_tile_base<kDqRows>(p, b, seq.q_start)) *
            (kDqRows * D) + int64_t(mb) * (64 * D));
    int end = 64 * D / 4;  // (float4s; 64-row tiles: the block's own tile, a constant)
    if constexpr (kDqRows != 64) {
      if ((mb + 1) * kPrepostRows >= seq.nq)  // the sequence's last block: to its last tile's end
        end = ((seq.nq + kDqRows - 1) / kDqRows * kDqRows - mb * 64) * (D / 4);
    }
#pragma unroll
    for (int i = threadIdx.x; i < end; i += kPrepostThreads)
      acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // (fa3 mode's split group: its workspace starts at zero, one share per block)
  if (p.kv_head_splits > 1)
    zero_split_sums_share(p, b, h, mb, int(gridDim.x), int(threadIdx.x), kPrepostThreads);
  const int col = (threadIdx.x % kLanesPerRow) * 8;
#pragma unroll
  for (int r0 = 0; r0 < kPrepostRows; r0 += kRowsPerPass) {
    const int r = mb * kPrepostRows + r0 + threadIdx.x / kLanesPerRow;
    const bool ok = r < seq.nq;  // (no early exit: the whole lane group takes part in the sums)
    const int64_t row = seq.q_start + (ok ? r : 0);
    const T* o = reinterpret_cast<const T*>(p.out) + b * p.o_stride[0] + row * p.o_stride[1] +
                 h * p.o_stride[2] + col;
    const T* d = reinterpret_cast<const T*>(p.dout) + b * p.do_stride[0] + row * p.do_stride[1] +
                 h * p.do_stride[2] + col;
    float acc = 0.f;
    if (ok)
      acc = dot8_accumulate<T>(*reinterpret_cast<const uint4*>(o),
                               *reinterpret_cast<const uint4*>(d), acc);
#pragma unroll
    for (int m = kLanesPerRow / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, m);
    if (ok && threadIdx.x % kLanesPerRow == 0) {
      // (lse2 as bwd_common.cuh's load_row_softmax forms it, bit for bit: the KV-outer pass
      // takes it from here instead of forming it per column and key tile)
      const int64_t idx = rowstat_index(p, b, h, int(row));
      const float c = p.softmax_scale * 1.4426950408889634f;
      const float lse2 =
          load_row_softmax(reinterpret_cast<const float2*>(p.stats)[idx], c).lse2;
      reinterpret_cast<float4*>(p.rowstate)[idx] = make_float4(acc, lse2, 0.f, 0.f);
    }
  }
  if (rows_done) {
    __syncthreads();  // every thread's zeros and delta are written
    if (threadIdx.x == 0)
      counter_add_release(rows_done, min(kPrepostRows, seq.nq - mb * kPrepostRows));
  }
}

// dQ = alpha * dq_accum rounded once to the input dtype. dq_accum is tiled (tile.cuh,
// dq_accum_tiles): one block per (64-row tile, head, sequence) reads its tile with all its float4
// loads in flight at once, rounds into a row-major copy in shared memory, then writes whole
// 16-byte row chunks (the accumulator order scatters adjacent value pairs over 8 rows: stored
// straight, 4-byte stores measured 0.127 ms at 16k tokens x 2048, 2.3x cuDNN's dQ conversion).
// kRows 80: the 80-row pass's tiles (dQ^T's accumulator order, dq_accum_t_coord), a block each.
template <typename T, int D, int kRows = 64>
__global__ void __launch_bounds__(kPrepostThreads) dq_finish_kernel(const AttnParams p) {
  static_assert(kRows == 64 || (kRows == 80 && D == 128), "64-row tiles, or 80 at d = 128");
  // (row pitch D + 8: the 4-byte writes of a warp's 8 rows fall in different banks)
  constexpr int kLoads = kRows * D / (4 * kPrepostThreads), kPitch = D + 8;
  static_assert(kLoads * 4 * kPrepostThreads == kRows * D, "whole float4 loads per thread");
  __shared__ __align__(16) T tile[kRows * kPitch];
  const GridTile gt = block_tile(p, p.cu_seqlens_q, p.heads);
  const int mb = gt.tile, h = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  if (mb * kRows >= seq.nq) {
    if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);  // (as at the end)
    return;
  }
  // Launched under the KV-outer pass's last wave (pair_counters): the dq_accum rows are final
  // once every key of the (sequence, kv head) pair has added its dQ (its [pairs + pair] count;
  // each key once per block of its tile: kv_head_splits of them in fa3 mode's split group).
  // (The first warp waits, whole: no barrier sees a warp in two places.)
  if (p.pair_counters) {
    if (threadIdx.x < 32)
      counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) +
                               (int64_t(p.batch) + b) * p.heads_k + h / (p.heads / p.heads_k),
                           seq.nk * p.kv_head_splits);
    __syncthreads();
  }
  const float* acc = reinterpret_cast<const float*>(p.dq_accum) +
                     (int64_t(h) * dq_accum_tiles<kRows>(p) + dq_tile_base<kRows>(p, b, seq.q_start) + mb) * (kRows * D);
  float4 x[kLoads];
#pragma unroll
  for (int l = 0; l < kLoads; ++l)
    x[l] = *reinterpret_cast<const float4*>(acc + 4 * (threadIdx.x + l * kPrepostThreads));
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const float v[4] = {x[l].x, x[l].y, x[l].z, x[l].w};
    if constexpr (kRows == 64) {
#pragma unroll
      for (int e = 0; e < 4; e += 2) {  // values e, e + 1: one row, adjacent columns
        int row, col;
        dq_accum_coord(4 * (threadIdx.x + l * kPrepostThreads) + e, D, row, col);
        *reinterpret_cast<uint32_t*>(&tile[row * kPitch + col]) =
            pack2<T>(__fmul_rn(p.softmax_scale, v[e]), __fmul_rn(p.softmax_scale, v[e + 1]));
      }
    } else {  // (dQ^T's order: values e, e + 1 are adjacent rows of one column)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row, col;
        dq_accum_t_coord(4 * (threadIdx.x + l * kPrepostThreads) + e, D, row, col);
        tile[row * kPitch + col] = from_float<T>(__fmul_rn(p.softmax_scale, v[e]));
      }
    }
  }
  __syncthreads();
  T* dq = reinterpret_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[2];
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = threadIdx.x; c < kRows * kChunks; c += kPrepostThreads) {
    const int row = c / kChunks, col = (c % kChunks) * 8;
    const int i = mb * kRows + row;
    if (i < seq.nq)
      *reinterpret_cast<uint4*>(dq + int64_t(seq.q_start + i) * p.dq_stride[1] + col) =
          *reinterpret_cast<const uint4*>(&tile[row * kPitch + col]);
  }
  if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);  // (after its primary)
}

template <typename T, int D, int kDqRows = 64>
void launch_delta(const AttnParams& p) {
  AttnParams q = p;
  dim3 grid((p.seqlen_q + kPrepostRows - 1) / kPrepostRows, p.heads, p.batch);
  if (grid.x == 0) return;
  slot_grid(q, kPrepostRows, p.total_q, p.heads, grid);  // (varlen)
  delta_kernel<T, D, kDqRows><<<grid, kPrepostThreads, 0, reinterpret_cast<cudaStream_t>(p.stream)>>>(q);
  check_cuda(cudaGetLastError(), "backward delta pre-pass");
}

template <typename T, int D, int kRows = 64>
void launch_dq_finish(const AttnParams& p) {
  AttnParams q = p;
  dim3 grid((p.seqlen_q + kRows - 1) / kRows, p.heads, p.batch);
  if (grid.x == 0) return;
  slot_grid(q, kRows, p.total_q, p.heads, grid);  // (varlen)
  // pair_counters: the previous pass's programmatic dependent (variant 12: after it, counting)
  check_cuda(launch_kernel(dq_finish_kernel<T, D, kRows>, grid, dim3(kPrepostThreads), 0,
                           reinterpret_cast<cudaStream_t>(p.stream),
                           p.pair_counters != 0 && bwd_variant() != 12, q),
             "backward dQ finish");
}

}  // namespace gproj
