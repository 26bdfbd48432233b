// The zero-sum projection of gproj's dK (after the Hopper KV-outer pass with A in one part).
//
// Why: the KV-outer pass feeds A = dS - lambda P (fp32; from the rounded dS~, P~ with three
// consumer warpgroups, whose rows then sum to zero to fp32 rounding) to the dK GEMM rounded once
// to 16 bits. That rounding is unbiased and leaves each dK_j as accurate as two rounded parts do
// (CPU emulator, SPEC grid: worst median dK error 0.166-0.238% either way), but the rows of the
// rounded A no longer sum to zero exactly, and Σ_j dK_j, which softmax makes exactly 0, keeps
// ~2^-9 of |A||Q'|: up to 50x the SPEC's 1e-5.
// Instead of a second GEMM for A's low part, the gradient is projected back onto the law:
//
//     dK_j <- dK_j - w_j Σ_k dK_k,      w_j = ||dK_j|| / Σ_k ||dK_k||      (per sequence, kv head)
//
// The weights follow each key's own gradient: a key no query attends to keeps its (near) zero
// gradient, and every key moves by the same fraction of its norm, |Σ_k dK_k| / Σ_k ||dK_k|| (the
// residual the bar measures, ≤ 5e-4 here), far below one bf16 rounding (2^-9). Uniform weights
// failed the per-key bar (a key with a tiny gradient received the whole mean; NOTES.md session 7).
//
// The KV-outer pass's epilogue writes the fp32 dK (p.dk_unprojected) and, per kKeysumSlot keys
// (one consumer warpgroup's; at d = 256 one block's), Σ_j dK_j (head dim values) and Σ_j ||dK_j|| in fp64
// (p.dk_keysum); dk_keysum_total_kernel sums them in order; dk_project_kernel projects and rounds
// once into p.dk (and, where the caller asked for it, writes the projected fp32 dK into
// p.dk_accum: the value the SPEC's bar is measured on). One read of the fp32 dK and one bf16
// write. Bitwise reproducible: every sum has a fixed order.
#pragma once
#include <cuda_runtime.h>

#include "../api/params.h"
#include "../api/variants.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/pdl.cuh"
#include "../common/tile.cuh"

namespace gproj {

constexpr int kProjectRows = 128;  // keys per block of dk_project_kernel
constexpr int kProjectWarps = 8;
constexpr int kProjectUnroll = 4;  // key rows each lane group has in flight

// Keys per p.dk_keysum slot: one consumer warpgroup's of the KV-outer pass (gproj_cuda/ops.py
// allocates dk_keysum_slots(p) slots per (sequence, kv head) with the same number).
constexpr int kKeysumSlot = 64;
__host__ __device__ inline int dk_keysum_slots(int keys) {
  return (keys + kKeysumSlot - 1) / kKeysumSlot;
}
__host__ __device__ inline int dk_keysum_slots(const AttnParams& p) {
  return dk_keysum_slots(p.seqlen_k);
}

// Σ over a (sequence, kv head) pair's `slots` key-sum slots (`sums`, kCols = D + 1 doubles each),
// in place into slot 0, by `nthreads` threads (this one: t): the columns' slots in kKeysumParts<D>
// runs of consecutive slots, each summed in slot order, then the runs added in order. The order
// depends on the slot count alone, not on the thread count (the same order as the kernel's
// before session 21). run: kParts x kCols doubles of shared memory; sync(): a barrier of
// the nthreads threads.
template <int D> constexpr int kKeysumParts = 512 / (D + 1);
template <int D, class Sync>
__device__ __forceinline__ void keysum_total(double* sums, int slots, int t, int nthreads,
                                             double* run, Sync sync) {
  constexpr int kCols = D + 1, kParts = kKeysumParts<D>;
  const int per = (slots + kParts - 1) / kParts;
  for (int i = t; i < kParts * kCols; i += nthreads) {
    const int part = i / kCols, c = i - part * kCols;
    const int c_begin = part * per, c_end = min(slots, c_begin + per);
    double s = 0.0;
    for (int c0 = c_begin; c0 < c_end; c0 += 8) {  // (eight loads in flight, added in order)
      double x[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) x[u] = c0 + u < c_end ? sums[int64_t(c0 + u) * kCols + c] : 0.0;
#pragma unroll
      for (int u = 0; u < 8; ++u) s += x[u];
    }
    run[part * kCols + c] = s;
  }
  sync();
  if (slots > 0) {
    for (int c = t; c < kCols; c += nthreads) {
      double s = 0.0;
#pragma unroll
      for (int k = 0; k < kParts; ++k) s += run[k * kCols + c];
      sums[c] = s;
    }
  }
}

// Grid: (heads_k, batch). keysum_total of each pair. With AttnParams::pair_counters launched
// under the KV-outer pass's last wave (pdl.cuh): each block waits for its pair's keys (nk per
// block of a key tile: kv_head_splits of them with a split group), and counts one more once its
// total is in slot 0 (what dK's projection waits for).
template <int D>
__global__ void __launch_bounds__(512) dk_keysum_total_kernel(const AttnParams p) {
  constexpr int kCols = D + 1;
  const int hk = blockIdx.x, b = blockIdx.y;
  const SeqBounds seq(p, b);
  int* counter = p.pair_counters ? reinterpret_cast<int*>(p.pair_counters) +
                                       (int64_t(p.batch) + b) * p.heads_k + hk
                                 : nullptr;
  if (counter) {
    if (threadIdx.x == 0) pdl_launch_dependents();  // (dK's projection waits for each total)
    // (the pair's keys once per block of their tile: kv_head_splits of them with a split group)
    if (threadIdx.x < 32) counter_wait_acquire(counter, seq.nk * p.kv_head_splits);
    __syncthreads();
  }
  double* sums = reinterpret_cast<double*>(p.dk_keysum) +
                 (int64_t(b) * p.heads_k + hk) * dk_keysum_slots(p) * kCols;
  __shared__ double run[kKeysumParts<D> * kCols];
  keysum_total<D>(sums, dk_keysum_slots(seq.nk), int(threadIdx.x), int(blockDim.x), run,
                  [] { __syncthreads(); });
  if (counter) {
    __syncthreads();  // every thread's part of the total is written
    if (threadIdx.x == 0) counter_add_release(counter, 1);
    pdl_wait_primary_in_last_block(threadIdx.x == 0);  // (ends after its primary)
  }
}

// Grid: (ceil(seqlen_k / kProjectRows), heads_k, batch). Each block projects kProjectRows keys
// with the totals dk_keysum_total_kernel left in slot 0: a group of D / 4 lanes per key
// row (a float4 each), several rows in flight per group (the kernel is bound by the latency of
// its loads otherwise).
template <typename T, int D>
__global__ void __launch_bounds__(32 * kProjectWarps) dk_project_kernel(const AttnParams p) {
  // kVec float4s per lane (two at D = 256, so that a row's lane group stays inside one warp)
  constexpr int kVec = D <= 128 ? 1 : D / 128;
  constexpr int kLanes = D / (4 * kVec), kGroups = 32 * kProjectWarps / kLanes;  // lane groups per block
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  const GridTile gt = block_tile(p, p.cu_seqlens_k, p.heads_k);
  const int chunk = gt.tile, hk = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  if (chunk * kProjectRows >= seq.nk) {  // uniform for the block
    if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);  // (as at the end)
    return;
  }
  // Launched under the key-sum totals' (pair_counters): the pair's keys all written and its
  // total in slot 0 (the count reaches nk x kv_head_splits + 1). (d = 256: dQ's rounding, which follows, may
  // launch once every block has started.)
  if (p.pair_counters) {
    if (threadIdx.x == 0) pdl_launch_dependents();
    if (threadIdx.x < 32)  // (the whole first warp)
      counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) +
                               (int64_t(p.batch) + b) * p.heads_k + hk,
                           seq.nk * p.kv_head_splits + 1);
    __syncthreads();
  }
  __shared__ double total[D + 1];               // Σ_j dK_j, then Σ_j ||dK_j||
  const double* sums = reinterpret_cast<const double*>(p.dk_keysum) +
                       (int64_t(b) * p.heads_k + hk) * dk_keysum_slots(p) * (D + 1);
  for (int t = threadIdx.x; t <= D; t += blockDim.x) total[t] = sums[t];
  __syncthreads();
  const double inv_norms = total[D] > 0.0 ? 1.0 / total[D] : 0.0;
  const int64_t off = b * p.dk_stride[0] + int64_t(seq.k_start) * p.dk_stride[1] + hk * p.dk_stride[2];
  const float* in = reinterpret_cast<const float*>(p.dk_unprojected) + off;
  float* acc = p.dk_accum ? reinterpret_cast<float*>(p.dk_accum) + off : nullptr;  // may be `in`
  T* dk = reinterpret_cast<T*>(p.dk) + off;
  const int group = threadIdx.x / kLanes, col0 = 4 * kVec * (threadIdx.x % kLanes);
  const int j_end = min((chunk + 1) * kProjectRows, seq.nk);
  for (int j0 = chunk * kProjectRows + group; j0 < j_end; j0 += kGroups * kProjectUnroll) {
    float4 x[kProjectUnroll][kVec];
    float ss[kProjectUnroll];
#pragma unroll
    for (int u = 0; u < kProjectUnroll; ++u) {
      const int j = j0 + u * kGroups;
#pragma unroll
      for (int v = 0; v < kVec; ++v)
        x[u][v] = j < j_end ? *reinterpret_cast<const float4*>(in + int64_t(j) * p.dk_stride[1] + col0 + 4 * v)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < kProjectUnroll; ++u) {
      ss[u] = 0.f;
#pragma unroll
      for (int v = 0; v < kVec; ++v)
        ss[u] = fmaf(x[u][v].w, x[u][v].w, fmaf(x[u][v].z, x[u][v].z,
                fmaf(x[u][v].y, x[u][v].y, fmaf(x[u][v].x, x[u][v].x, ss[u]))));
      // the row's squared norm across its lane group (xor stays inside an aligned group)
#pragma unroll
      for (int m = kLanes / 2; m > 0; m >>= 1) ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], m);
    }
#pragma unroll
    for (int u = 0; u < kProjectUnroll; ++u) {
      const int j = j0 + u * kGroups;
      if (j >= j_end) continue;
      const double w = double(sqrtf(ss[u])) * inv_norms;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const int col = col0 + 4 * v;
        const float y0 = float(double(x[u][v].x) - w * total[col]);
        const float y1 = float(double(x[u][v].y) - w * total[col + 1]);
        const float y2 = float(double(x[u][v].z) - w * total[col + 2]);
        const float y3 = float(double(x[u][v].w) - w * total[col + 3]);
        const int64_t row = int64_t(j) * p.dk_stride[1] + col;
        *reinterpret_cast<uint2*>(dk + row) = make_uint2(pack2<T>(y0, y1), pack2<T>(y2, y3));
        if (acc) *reinterpret_cast<float4*>(acc + row) = make_float4(y0, y1, y2, y3);
      }
    }
  }
  if (p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);  // (after its primary)
}

// After the KV-outer pass (its epilogue wrote p.dk_unprojected and the key sums).
template <typename T, int D>
void launch_dk_project(const AttnParams& p) {
  AttnParams q = p;
  dim3 grid((p.seqlen_k + kProjectRows - 1) / kProjectRows, p.heads_k, p.batch);
  if (grid.x == 0) return;
  slot_grid(q, kProjectRows, p.total_k, p.heads_k, grid);  // (varlen)
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  // pair_counters: each kernel the programmatic dependent of the previous one (pdl.cuh)
  const bool programmatic = p.pair_counters != 0 && bwd_variant() != 12;
  check_cuda(launch_kernel(dk_keysum_total_kernel<D>, dim3(p.heads_k, p.batch), dim3(512), 0,
                           stream, programmatic, p),
             "backward dK key sums");
  check_cuda(launch_kernel(dk_project_kernel<T, D>, grid, dim3(32 * kProjectWarps), 0, stream,
                           programmatic, q),
             "backward dK projection");
}

}  // namespace gproj
