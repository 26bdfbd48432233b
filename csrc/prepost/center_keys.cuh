// Pre-pass of the gproj numerics mode: exact key centering (gproj_cuda/centering.py explains
// why). Two small memory-bound kernels instead of the eight PyTorch ops (and fp32 temporaries)
// of the reference implementation:
//   1. key_range: per (sequence, kv head, coordinate) min and max of K, reduced with integer
//      atomics on an order-preserving encoding of the floats: atomicMax on the encoding for the
//      max, on its complement for the min, so that one memset to zero initializes both (the
//      workspace is memset, not initialized by a kernel; two memsets with different values cost
//      ~5 us each between the kernels);
//   2. center: c = midpoint rounded to the dtype where every key lies in [c/2, 2c] (Sterbenz:
//      k - c is then exact), else 0; writes K' = K - c and c. Lazy (k_center_flags set): a
//      (sequence, kv head) whose shift is 0 in every coordinate gets no K' (it would equal K);
//      its flag says so and the forward reads K there. Random or zero-mean keys then cost one
//      read of K instead of two reads and a write.
// The backward needs K' for the same shift: handed the forward's (k_shift_given), it runs step 2
// alone.
// Reads K twice and writes it once: ~3 |K| bytes, about 1% of a forward pass at N = 4096. Keys
// with no common offset in any coordinate (random keys, zero-mean ones) let the range pass stop
// after a probe of 64 rows per block (key_range_kernel says why that is exact): ~1/8 of K read.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "../api/params.h"
#include "../common/cuda_check.h"
#include "../common/device.cuh"
#include "../common/pdl.cuh"
#include "../common/tile.cuh"

namespace gproj {

// Order-preserving map float -> uint32 (x < y iff enc(x) < enc(y)), so min/max are integer ops.
__device__ __forceinline__ uint32_t enc_order(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float dec_order(uint32_t e) {
  return __uint_as_float((e & 0x80000000u) ? (e & 0x7fffffffu) : ~e);
}

constexpr int kCenterRows = 256;  // key rows per block

template <typename T2> __device__ __forceinline__ T2 packed_pair(float x);
template <> __device__ __forceinline__ __nv_bfloat162 packed_pair(float x) { return __floats2bfloat162_rn(x, x); }
template <> __device__ __forceinline__ __half2 packed_pair(float x) { return __floats2half2_rn(x, x); }

// The keys' rule: every key's coordinate in [c/2, 2c] for c the midpoint (Sterbenz: k - c exact).
// Monotone in the range: once false for some of a coordinate's keys, false for all of them (a
// wider range only lowers lo and raises hi), which is what lets the range pass stop early.
__device__ __forceinline__ bool key_coordinate_shifted(float lo, float hi) {
  return (lo > 0.f && hi <= 2.f * lo) || (hi < 0.f && lo >= 2.f * hi);
}

// Rows loaded kRangeBatch at a time, every load of a batch issued before the first min/max, so
// that a thread has 8 x 16 bytes in flight. Why: with one load in flight per thread (the loop's
// min/max waits for it) eight blocks of 256 threads keep 32 KB per SM in flight, which at ~1.5 us
// of DRAM latency under load is ~2.8 TB/s: what the pass measured (session 18, 24 us for 64 MB;
// `#pragma unroll 4` then changed nothing, at the 32 registers of eight blocks per SM: 4 loads
// do not fit in them). Four blocks per SM (64 registers) with 8 loads each keep 128 KB in flight.
// Measured (bench/NOTES.md session 24 item 6): ~3 us less per call, -0.5% of the gproj forward
// at N = 2k, both directions; under half of what 4 TB/s would give.
// (Nsight Compute, session 12, before the warp pre-reduction: five blocks per SM, DRAM 53% busy.)
constexpr int kRangeBatch = 8;
constexpr int kRangeBlocksPerSm = 4;  // (the kernel's __launch_bounds__)
// The probe (keys only, `probe`): a block first reduces its first 64 rows alone. Where those
// already leave every coordinate unshifted (keys of both signs, or spread past a factor of 2: any
// zero-mean coordinate of a few rows), the whole (sequence, head) is unshifted, by the rule's
// monotonicity: the block publishes that range and stops, and the shift comes out 0 as from the
// full range (the center kernel reads only the merged ranges; an unshifted coordinate's midpoint
// is never used). Keys with a common offset in any coordinate (what centering is for) find
// nothing to stop on and read everything, as before, plus one block reduction. With the probe,
// blocks take several 256-row chunks each (rows_per_block), so that the grid is about one wave:
// every block probes at once, instead of a second wave reading its chunks in full while the first
// wave's probes have already decided.
constexpr int kProbeRows = 64;
template <typename T, int D>
__global__ void __launch_bounds__(256, kRangeBlocksPerSm)
    key_range_kernel(const AttnParams p, int rows_per_block, bool probe, uint32_t* lo_enc,
                     uint32_t* hi_enc) {
  constexpr int kThreadsPerRow = D / 8, kRowsInFlight = 256 / kThreadsPerRow;
  constexpr int kProbeBatch = kProbeRows / kRowsInFlight;  // 2, 4, 8 row sets at d = 64, 128, 256
  pdl_launch_dependents();  // the center kernel may launch (it waits for this grid's end)
  const GridTile gt = block_tile(p, p.cu_seqlens_k, p.heads_k);
  const int chunk = gt.tile, hk = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  const int r0 = chunk * rows_per_block;
  if (r0 >= seq.nk) return;
  const int col = (threadIdx.x % kThreadsPerRow) * 8;
  const T* base = reinterpret_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2] + col;
  // Min and max kept as packed 16-bit pairs (the min or max of 16-bit values is one of them,
  // so this is exact): 8 registers for a thread's 8 coordinates instead of 16.
  using T2 = typename std::conditional<is_bf16<T>::value, __nv_bfloat162, __half2>::type;
  const T2 inf2 = packed_pair<T2>(INFINITY), ninf2 = packed_pair<T2>(-INFINITY);
  T2 lo[4], hi[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) lo[e] = inf2, hi[e] = ninf2;
  const int r_end = min(r0 + rows_per_block, seq.nk);
  // kB row sets from row rb on, kRowsInFlight apart, into lo / hi (rows past the end: neither
  // loaded nor reduced)
  auto take_rows = [&](int rb, auto batch) {
    constexpr int kB = decltype(batch)::value;
    uint4 raw[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      const int r = rb + i * kRowsInFlight;
      raw[i] = r < r_end ? *reinterpret_cast<const uint4*>(base + int64_t(seq.k_start + r) * p.k_stride[1])
                         : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < kB; ++i) {
      if (rb + i * kRowsInFlight >= r_end) break;
      const T2* w = reinterpret_cast<const T2*>(&raw[i]);
#pragma unroll
      for (int e = 0; e < 4; ++e) lo[e] = __hmin2(lo[e], w[e]), hi[e] = __hmax2(hi[e], w[e]);
    }
  };
  // Reduce over the block's rows: first the warp's rows (lanes kThreadsPerRow apart share
  // columns; lo / hi stay ranges of the block's own keys, so rows may still be added after), then
  // the 8 warps in shared memory, then one atomic per coordinate and block: thousands of blocks
  // hitting the same few addresses otherwise serialize on the atomics. only_if_unshifted (the
  // probe): publish and return true only where the block's range leaves every coordinate
  // unshifted. (Called by every thread: it holds two block barriers.)
  constexpr int kWarps = 256 / 32;
  __shared__ float s_lo[kWarps][D], s_hi[kWarps][D];
  auto reduce_and_publish = [&](bool only_if_unshifted) {
#pragma unroll
    for (int m = kThreadsPerRow; m < 32; m *= 2) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo[e] = __hmin2(lo[e], __shfl_xor_sync(0xffffffffu, lo[e], m));
        hi[e] = __hmax2(hi[e], __shfl_xor_sync(0xffffffffu, hi[e], m));
      }
    }
    const int warp = threadIdx.x / 32;
    // (after a probe, its __syncthreads_and has followed every thread's reads of s_lo / s_hi)
    if (threadIdx.x % 32 < kThreadsPerRow) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 l = unpack2<T>(*reinterpret_cast<const uint32_t*>(&lo[e]));
        const float2 h = unpack2<T>(*reinterpret_cast<const uint32_t*>(&hi[e]));
        s_lo[warp][col + 2 * e] = l.x, s_lo[warp][col + 2 * e + 1] = l.y;
        s_hi[warp][col + 2 * e] = h.x, s_hi[warp][col + 2 * e + 1] = h.y;
      }
    }
    __syncthreads();
    const int d = threadIdx.x;  // (D <= 256: one coordinate per thread at most)
    float l = INFINITY, h = -INFINITY;
    if (d < D) {
#pragma unroll
      for (int r = 0; r < kWarps; ++r) l = fminf(l, s_lo[r][d]), h = fmaxf(h, s_hi[r][d]);
    }
    if (only_if_unshifted && !__syncthreads_and(d >= D || !key_coordinate_shifted(l, h)))
      return false;
    if (d < D) {
      const int64_t slot = (int64_t(b) * p.heads_k + hk) * D + d;
      atomicMax(lo_enc + slot, ~enc_order(l));  // min as the max of the complement
      atomicMax(hi_enc + slot, enc_order(h));
    }
    return true;
  };
  static_assert(D <= 256 && kProbeRows % kRowsInFlight == 0, "one coordinate per thread");
  int rb = r0 + threadIdx.x / kThreadsPerRow;
  if (probe) {
    take_rows(rb, std::integral_constant<int, kProbeBatch>{});
    rb += kProbeBatch * kRowsInFlight;
    if (reduce_and_publish(true)) return;
  }
  for (; rb < r_end; rb += kRangeBatch * kRowsInFlight) take_rows(rb, std::integral_constant<int, kRangeBatch>{});
  reduce_and_publish(false);
}

template <typename T, int D>
__global__ void __launch_bounds__(256) center_kernel(const AttnParams p, const uint32_t* lo_enc,
                                                     const uint32_t* hi_enc) {
  constexpr int kThreadsPerRow = D / 8, kRowsInFlight = 256 / kThreadsPerRow;
  // Launched as the range pass's programmatic dependent (center_keys_impl): this grid's blocks
  // start under the range pass and wait here for its end; the forward, the programmatic
  // dependent of this grid, may launch as soon as every block of it has started.
  pdl_launch_dependents();
  pdl_wait_primary();
  const GridTile gt = block_tile(p, p.cu_seqlens_k, p.heads_k);
  const int chunk = gt.tile, hk = gt.head, b = gt.batch;
  const SeqBounds seq(p, b);
  const int r0 = chunk * kCenterRows;
  const int col = (threadIdx.x % kThreadsPerRow) * 8;
  const int64_t slot = (int64_t(b) * p.heads_k + hk) * D + col;
  float c[8];
  T* shift = reinterpret_cast<T*>(p.k_shift) + slot;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (p.k_shift_given) {  // the forward's pre-pass found c from the same K and wrote it
      c[e] = to_float(shift[e]);
      continue;
    }
    const float lo = dec_order(~lo_enc[slot + e]), hi = dec_order(hi_enc[slot + e]);
    const float mid = to_float(from_float<T>(0.5f * (lo + hi)));
    bool shifted;
    if (p.center_approx) {
      // Queries (only the dK GEMM's operand): any offset above an eighth of the range goes, the
      // subtraction rounded where it is not exact. A query offset left in Q' multiplies the row
      // residual of the once-rounded A in every dK_j (up to 2x the error of the exact forms at
      // N(0,1) + 6, which the exact rule cannot center: bench/NOTES.md session 17); rounding Q - c
      // costs one rounding of the centered query instead. Empty or non-finite ranges: 0.
      shifted = isfinite(lo) && isfinite(hi) && isfinite(mid) && fabsf(mid) > 0.125f * (hi - lo);
    } else {  // keys (the scores): all keys in [c/2, 2c], so that k - c is exact (Sterbenz)
      shifted = key_coordinate_shifted(lo, hi);
    }
    c[e] = shifted ? mid : 0.f;
  }
  bool write_kc = p.k_centered != 0;
  if (p.k_center_flags) {  // lazy: K' only where something is centered (every block decides alike)
    bool any = false;
#pragma unroll
    for (int e = 0; e < 8; ++e) any |= c[e] != 0.f;
    any = __syncthreads_or(any);
    if (chunk == 0 && threadIdx.x == 0)
      reinterpret_cast<int*>(p.k_center_flags)[int64_t(b) * p.heads_k + hk] = any ? 1 : 0;
    write_kc = write_kc && any;
  }
  if (chunk == 0 && threadIdx.x < kThreadsPerRow && !p.k_shift_given) {
#pragma unroll
    for (int e = 0; e < 8; ++e) shift[e] = from_float<T>(c[e]);
  }
  if (r0 >= seq.nk || !write_kc) return;  // k_centered = 0: only the shift is wanted
  const T* src = reinterpret_cast<const T*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[2] + col;
  T* dst = reinterpret_cast<T*>(p.k_centered) + b * p.kc_stride[0] + hk * p.kc_stride[2] + col;
  for (int r = r0 + threadIdx.x / kThreadsPerRow; r < min(r0 + kCenterRows, seq.nk);
       r += kRowsInFlight) {
    const int64_t row = seq.k_start + r;
    const uint4 raw = *reinterpret_cast<const uint4*>(src + row * p.k_stride[1]);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = unpack2<T>(w[e]);
      // exact by construction for the keys; rounded where inexact for the queries (center_approx)
      o[e] = pack2<T>(f.x - c[2 * e], f.y - c[2 * e + 1]);
    }
    st_global_v4(dst + row * p.kc_stride[1], make_uint4(o[0], o[1], o[2], o[3]));
  }
}

// K' = K - c and c, for every sequence and kv head. `workspace`: 2 * batch * heads_k * D + 4
// uint32, all zeroed here (the last four for the forward's tile counter: tile_counter_zeroed).
// With p.k_shift_given, c is read from k_shift (the forward's pre-pass wrote it from the same K):
// no workspace, no range pass; K' and the lazy flags come out bitwise as the forward's.
// GPROJ_FWD_AB bit 64: the keys' range pass without the probe (one 256-row chunk per block, every
// row read), as before session 25.
template <typename T, int D>
void center_keys_impl(const AttnParams& p) {
  cudaStream_t stream = reinterpret_cast<cudaStream_t>(p.stream);
  AttnParams q = p;
  dim3 grid(max(1, (p.seqlen_k + kCenterRows - 1) / kCenterRows), p.heads_k, p.batch);
  slot_grid(q, kCenterRows, p.total_k, p.heads_k, grid);  // (varlen)
  uint32_t *lo = nullptr, *hi = nullptr;
  if (!p.k_shift_given) {
    const int64_t n = int64_t(p.batch) * p.heads_k * D;
    lo = reinterpret_cast<uint32_t*>(p.center_workspace);
    hi = lo + n;
    // lo and hi, and the spare word the forward may take as its tile counter (AttnParams)
    check_cuda(cudaMemsetAsync(lo, 0x00, (2 * n + 4) * sizeof(uint32_t), stream),
               "center keys: memset");
    // The probe only for the keys' rule: the queries' (center_approx) is not monotone.
    const bool probe = !p.center_approx && !(p.fwd_ab & 64);
    int rows = kCenterRows;
    if (probe) {  // chunks per block: about one wave of blocks (kRangeBlocksPerSm per SM)
      const int64_t rows_all = p.cu_seqlens_k ? int64_t(p.total_k) : int64_t(p.batch) * p.seqlen_k;
      const int64_t chunks = (rows_all / kCenterRows + p.batch) * p.heads_k;
      const int64_t wave = int64_t(kRangeBlocksPerSm) * std::max(p.num_sms, 1);
      rows *= int(std::min<int64_t>((chunks + wave - 1) / wave, 1 << 16));
    }
    AttnParams qr = p;
    dim3 rgrid(max(1, (p.seqlen_k + rows - 1) / rows), p.heads_k, p.batch);
    slot_grid(qr, rows, p.total_k, p.heads_k, rgrid);  // (varlen)
    key_range_kernel<T, D><<<rgrid, 256, 0, stream>>>(qr, rows, probe, lo, hi);
    check_cuda(cudaGetLastError(), "center keys: range");
  }
  // As the range pass's programmatic dependent (GPROJ_FWD_AB bit 128: one after the other).
  const uint32_t *lo_c = lo, *hi_c = hi;
  check_cuda(launch_kernel(center_kernel<T, D>, grid, dim3(256), 0, stream,
                           !p.k_shift_given && !(p.fwd_ab & 128), q, lo_c, hi_c),
             "center keys: subtract");
  check_cuda(cudaGetLastError(), "center keys: subtract");
}

}  // namespace gproj
