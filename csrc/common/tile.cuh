// Where a block's rows live: sequence bounds (dense or varlen), tile loads, and the mask.
#pragma once
#include <algorithm>
#include <cstdint>

#include "../api/params.h"
#include "device.cuh"

namespace gproj {

// Rows of sequence b: dense tensors use the fixed lengths; varlen ones read cu_seqlens.
struct SeqBounds {
  int q_start, nq, k_start, nk;
  __device__ SeqBounds(const AttnParams& p, int b) {
    if (p.cu_seqlens_q) {
      const int* cq = reinterpret_cast<const int*>(p.cu_seqlens_q);
      const int* ck = reinterpret_cast<const int*>(p.cu_seqlens_k);
      q_start = cq[b];
      nq = cq[b + 1] - q_start;
      k_start = ck[b];
      nk = ck[b + 1] - k_start;
    } else {
      q_start = 0;
      nq = p.seqlen_q;
      k_start = 0;
      nk = p.seqlen_k;
    }
  }
};

// Whether a (sequence, kv head)'s key shift may be nonzero: without the lazy pre-pass's flags
// (a caller's own K' and shift, or the full pre-pass), always; with them, where the flag is set.
__device__ __forceinline__ bool keys_shifted(const AttnParams& p, int b, int hk) {
  return p.k_center_flags == 0 ||
         reinterpret_cast<const int*>(p.k_center_flags)[int64_t(b) * p.heads_k + hk] != 0;
}

// Whether a kernel reads K' = K - c (the centering pre-pass's output) for sequence b and kv head
// hk, or the user's K: fa3 mode and pre-centered keys give no K'; a lazy pre-pass writes K' only
// where some coordinate has a nonzero shift (elsewhere K' = K bit for bit).
__device__ __forceinline__ bool reads_centered_keys(const AttnParams& p, int b, int hk) {
  return p.k_centered != 0 && keys_shifted(p, b, hk);
}

// The same for the queries (the Hopper backward's Q' = Q - c of the dK GEMM), head h.
__device__ __forceinline__ bool reads_centered_queries(const AttnParams& p, int b, int h) {
  return p.q_center_flags == 0 ||
         reinterpret_cast<const int*>(p.q_center_flags)[int64_t(b) * p.heads + h] != 0;
}

// Which tile, head and batch each one-tile block of an sm90 pass runs (host: tile_grid; device:
// grid_tile). Blocks start in linear blockIdx order (x fastest). Under a causal-like mask
// (window_right >= 0) the tiles of a (sequence, head) pair differ in length, up to the pair's
// whole range, and whatever long tiles start last set the grid's end while the other SMs idle.
// Pair after pair, each pair's longest tile first (grid (tiles, heads, batch)), the long tiles
// are spread over the grid; that is enough where the grid is many waves long, and measured 1-2%
// faster there than taking every pair's longest tile first (session 12: more pairs' K/V or Q/dO
// in flight at once). A grid of at most kGlobalWaves waves (GQA's KV-outer pass: a block per kv
// head, eight query heads long) takes every pair's longest tile first, then the next longest,
// ... (grid (heads, batch, tiles): rank-major): -9 to -12% for the causal GQA backward at N = 4k,
// where pair after pair left long blocks for the second wave (bench/NOTES.md, session 12). The
// choice costs registers all the same: ptxas re-reads a plain blockIdx coordinate where it needs
// one, but holds these selected ones across the kernels' loops (8-24 more bytes of spill in four
// backward kernels; tests/test_sass.py).
// The forward's longer grids (since session 32) go by groups of pairs (grid_group): each group's
// longest tiles first, then its next longest, ..., group after group, with as many pairs per
// group as stream their K and V within half of L2, and the smaller group (the remainder of the
// pairs) first. Pair after pair is a sawtooth of long and short tiles whose last
// long ones start late: by a model of the greedy block dispatch (scripts/sched_model.py) it
// leaves the busiest SM 11-14% over the mean at d = 256 N = 2k-8k causal (80-key tiles, 16-64
// pairs of 16-64 tiles), ~6% at d = 128, 2-4% and ~1% with the groups. Measured (bench/NOTES.md
// session 32), the d = 256 causal forward 2k-8k: -6 to -9%. The remainder
// group goes first because, last, its few pairs' long tiles would start when the other SMs run
// out of work (the persistent forward's schedule, decode_tile, orders its groups alike). The
// backward's passes keep pair after pair: there the groups measured 0 to +3.6% slower (gproj,
// causal, N = 2k-8k; bench/NOTES.md session 32), its passes running under each other's last
// wave (programmatic dependent launches) fill the SMs the sawtooth leaves idle.
// tile_order 2: pair after pair at every size; 1: shortest first within each pair; 3: the orders
// before session 32 (pair after pair beyond kGlobalWaves waves, the persistent forward's
// remainder group last). Without such a mask: grid order.
constexpr int kGlobalWaves = 4;

// Pairs per group whose `bytes_per_pair` (the pass's streamed operands of one pair) fill at most
// half of L2, at least 1, at most `pairs`.
inline int l2_pair_group(const AttnParams& p, int64_t bytes_per_pair, int pairs) {
  return int(std::max<int64_t>(1, std::min<int64_t>(pairs, (int64_t(p.l2_bytes) / 2) /
                                                               std::max<int64_t>(bytes_per_pair, 1))));
}

// Host: the grid of a pass with `tiles` tiles per (head, batch) pair; sets p.grid_rank_major and
// p.grid_group (p: the launch's own copy of the parameters). group_bytes: what one pair's tiles
// stream (the group size's measure), or 0: no groups (pair after pair beyond kGlobalWaves).
inline dim3 tile_grid(AttnParams& p, int tiles, int heads, int batch, int64_t group_bytes = 0) {
  const int sms = p.num_sms > 0 ? p.num_sms : 132;
  const int64_t total = int64_t(tiles) * heads * batch;
  const bool masked = p.window_right >= 0;
  p.grid_rank_major = masked && (p.tile_order == 0 || p.tile_order == 3) &&
                      total <= int64_t(kGlobalWaves) * sms;
  p.grid_group = 0;
  if (p.grid_rank_major) return dim3(heads, batch, tiles);
  if (group_bytes > 0 && masked && p.tile_order == 0 && p.l2_bytes > 0 &&
      total < (int64_t(1) << 31)) {
    p.grid_group = l2_pair_group(p, group_bytes, heads * batch);
    p.grid_tiles = tiles;
    p.grid_heads = heads;
    return dim3(unsigned(total), 1, 1);
  }
  return dim3(tiles, heads, batch);
}

struct GridTile {
  int tile, head, batch;
};
// longest_last: tile index tiles - 1 is a pair's longest (Q-outer: the last query tiles see the
// most keys), else index 0 (KV-outer: the first keys are seen by the most queries). kGrouped:
// the pass's grid may be in groups of pairs (tile_grid's group_bytes; the forward's), compiled in
// only there, so that the backward kernels do not carry the decode.
template <bool kGrouped = false>
__device__ __forceinline__ GridTile grid_tile(const AttnParams& p, bool longest_last) {
  if (kGrouped && p.grid_group > 0) {  // groups of pairs, the remainder group first (tile_grid)
    const int G = p.grid_group, T = p.grid_tiles, heads = p.grid_heads;
    const int pairs = int(gridDim.x) / T, R = pairs - (pairs - 1) / G * G;
    int idx = int(blockIdx.x), rank, pair;
    if (idx < R * T) {
      rank = idx / R;
      pair = idx - rank * R;
    } else {
      idx -= R * T;
      const int g = idx / (G * T), r = idx - g * (G * T);
      rank = r / G;
      pair = R + g * G + (r - rank * G);
    }
    const int b = pair / heads;
    return {longest_last ? T - 1 - rank : rank, pair - b * heads, b};
  }
  if (p.grid_rank_major) {
    const int rank = int(blockIdx.z), tiles = int(gridDim.z);
    return {longest_last ? tiles - 1 - rank : rank, int(blockIdx.x), int(blockIdx.y)};
  }
  const int tiles = int(gridDim.x);
  int rank = int(blockIdx.x);  // 0 = a pair's longest tile
  if (p.window_right < 0) return {rank, int(blockIdx.y), int(blockIdx.z)};
  if (p.tile_order == 1) rank = tiles - 1 - rank;
  return {longest_last ? tiles - 1 - rank : rank, int(blockIdx.y), int(blockIdx.z)};
}

// Varlen grids of real tiles. A grid of num_m_blocks (the longest sequence's tiles) per sequence
// visits mostly empty tiles where lengths vary (mean 1k, uniform in [256, 1792]: 13 per
// sequence, 7 real on average); the exact count, the sum of ceil(n_b / bm), needs cu_seqlens on
// the host (a device sync per call). Instead sequence b owns the slots
//   [s(b), s(b + 1)),  s(b) = floor(cu[b] / bm) + b,
// of which there are floor(cu[b+1] / bm) - floor(cu[b] / bm) + 1 >= ceil(n_b / bm), at most one
// more: every real tile has a slot, at most one slot per sequence is empty, and the host knows the
// grid, s(batch) <= floor(total / bm) + batch, without reading cu_seqlens. s is strictly
// increasing and depends on cu[b] alone, so a warp finds a slot's sequence by a 32-ary search
// (one round of 32 loads per factor of 32 in the batch: one round up to 32 sequences).
__host__ __device__ __forceinline__ int varlen_slots(int total_rows, int batch, int bm) {
  return total_rows / bm + batch;
}

struct VarlenSlot {
  int b, first, count, tiles;  // sequence, its slots [first, first + count), its real tiles
};
// The sequence that owns `slot`. Called by all 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ VarlenSlot varlen_slot(const int* cu, int batch, int bm, int slot) {
  const int lane = int(threadIdx.x) & 31;
  int lo = 0, hi = batch;  // the answer, the largest b with s(b) <= slot, is in [lo, hi)
  while (hi - lo > 1) {
    const int step = (hi - lo + 31) / 32;
    const int b = lo + lane * step;
    const bool le = b < hi && cu[b] / bm + b <= slot;
    const unsigned m = __ballot_sync(0xffffffffu, le);  // lanes 0.. (s increasing; s(lo) <= slot)
    const int j = 31 - __clz(m);
    lo += j * step;
    hi = min(hi, lo + step);
  }
  const int start = cu[lo], end = cu[lo + 1];
  const int first = start / bm + lo;
  return {lo, first, end / bm + lo + 1 - first, (end - start + bm - 1) / bm};
}

// Host: a varlen pass's one-tile grid of slots of `rows` rows, 1-D, sequence by sequence and in
// each sequence (kv) head by (kv) head, `heads` x varlen_slots blocks; sets p.slot_rows (p: the
// launch's own copy). total: the packed rows of the side the tiles cut (q or k). False (p
// unchanged) for dense problems, grids over 2^31 - 1 blocks and GPROJ_FWD_AB bit 4 (A/B runs:
// the grid of every sequence as long as the longest, as before session 14).
inline bool slot_grid(AttnParams& p, int rows, int total, int heads, dim3& grid) {
  if (p.cu_seqlens_q == 0 || (p.fwd_ab & 4)) return false;
  const int64_t n = int64_t(heads) * varlen_slots(total, p.batch, rows);
  if (n >= (int64_t(1) << 31)) return false;
  p.slot_rows = rows;
  grid = dim3(unsigned(n), 1, 1);
  return true;
}

// Device: the (tile, head, sequence) of this block of a slot grid (p.slot_rows set), in the order
// of grid_tile: pair after pair; under a causal-like mask each pair's longest tile first (its
// last with longest_last: Q-outer passes; else its first); an empty slot gets tile = the
// sequence's tile count, past its end. cu: the cu_seqlens of the side the tiles cut. Called by
// all 32 lanes of a warp (varlen_slot); every lane gets the result.
__device__ __forceinline__ GridTile slot_tile(const AttnParams& p, const int* cu, int heads,
                                              bool longest_last) {
  const int L = int(blockIdx.x);
  const VarlenSlot vs = varlen_slot(cu, p.batch, p.slot_rows, L / heads);
  const int local = L - heads * vs.first;
  const int h = local / vs.count, rank = local - h * vs.count;
  if (rank >= vs.tiles) return {vs.tiles, h, vs.b};
  if (p.window_right < 0) return {rank, h, vs.b};
  const int r = p.tile_order == 1 ? vs.tiles - 1 - rank : rank;  // 0 = the longest
  return {longest_last ? vs.tiles - 1 - r : r, h, vs.b};
}

// The (tile, head, batch) of a block of a simple pass (the pre- and post-processing kernels):
// its grid's coordinates (tiles, heads, batch), or with a slot grid (varlen), slot_tile's. cu:
// the cu_seqlens of the side the tiles cut. Called by every thread of the block (whole warps).
__device__ __forceinline__ GridTile block_tile(const AttnParams& p, uint64_t cu, int heads) {
  if (p.slot_rows) return slot_tile(p, reinterpret_cast<const int*>(cu), heads, false);
  return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
}

// Bottom-right aligned band mask of FlashAttention-3: query i sees key j iff
// j < nk, j <= i + off + right (right >= 0) and j >= i + off - left (left >= 0), with
// off = nk - nq + shift (shift != 0 only for chunk pairs of context parallelism).
struct Mask {
  int nq, nk, left, right, shift;
  __host__ __device__ Mask(int nq_, int nk_, int left_, int right_, int shift_)
      : nq(nq_), nk(nk_), left(left_), right(right_), shift(shift_) {}
  __host__ __device__ __forceinline__ int offset() const { return nk - nq + shift; }
  __host__ __device__ __forceinline__ bool visible(int i, int j) const {
    const int d = i + offset();
    return i < nq && j < nk && (right < 0 || j <= d + right) && (left < 0 || j >= d - left);
  }
  // Keys visible to query i, as offsets from key j0: j is visible iff lo <= j - j0 < hi. A
  // thread tests each of its accumulator columns against two per-row bounds, so only the bounds
  // stay live across the key loop; per-element (i, j) coordinates held there cost the forward's
  // 176-key tile 9 KB of spill (bench/NOTES.md, "Session 7").
  __host__ __device__ __forceinline__ void row_columns(int i, int j0, int& lo, int& hi) const {
    const int d = i + offset() - j0;
    hi = nk - j0;
    if (right >= 0) hi = min(hi, d + right + 1);
    lo = left >= 0 ? d - left : INT_MIN;
    if (i >= nq) hi = INT_MIN;  // a padding row sees nothing
  }
  // Queries visible to key j, as offsets from query i0: i is visible iff lo <= i - i0 < hi (the
  // backward's S^T tiles, whose rows are keys). A key past the end: none (lo = INT_MAX).
  // Checked against visible() on the CPU for 200k random masks and tiles (session 16).
  __host__ __device__ __forceinline__ void row_queries(int j, int i0, int& lo, int& hi) const {
    const int d = j - offset();  // the query on key j's diagonal
    lo = right >= 0 ? d - right - i0 : INT_MIN;
    hi = nq - i0;
    if (left >= 0) hi = min(hi, d + left + 1 - i0);
    if (j >= nk) lo = INT_MAX;
  }
  // Keys [lo, hi) that any of the queries [i0, i1) can see.
  __host__ __device__ __forceinline__ void key_range(int i0, int i1, int& lo, int& hi) const {
    hi = nk;
    if (right >= 0) hi = min(nk, i1 - 1 + offset() + right + 1);
    lo = 0;
    if (left >= 0) lo = max(0, i0 + offset() - left);
  }
  // Queries [lo, hi) that can see any of the keys [j0, j1).
  __host__ __device__ __forceinline__ void query_range(int j0, int j1, int& lo, int& hi) const {
    lo = 0;
    if (right >= 0) lo = max(0, j0 - offset() - right);
    hi = nq;
    if (left >= 0) hi = min(nq, j1 - 1 - offset() + left + 1);
  }
  // Key tiles [lo, hi) of width bn that the queries [i0, i1) need (lo == hi: none).
  __host__ __device__ __forceinline__
  void key_blocks(int i0, int i1, int bn, int& lo, int& hi) const {
    int k_lo, k_hi;
    key_range(i0, i1, k_lo, k_hi);
    lo = k_lo / bn;
    hi = k_hi > k_lo ? (k_hi + bn - 1) / bn : lo;
  }
  // Query tiles [lo, hi) of height bm that see any of the keys [j0, j1).
  __host__ __device__ __forceinline__
  void query_blocks(int j0, int j1, int bm, int& lo, int& hi) const {
    int q_lo, q_hi;
    query_range(j0, j1, q_lo, q_hi);
    lo = q_lo / bm;
    hi = q_hi > q_lo ? (q_hi + bm - 1) / bm : lo;
  }
  // True unless every (i, j) of the tile is visible.
  __host__ __device__ __forceinline__ bool tile_partial(int i0, int i1, int j0, int j1) const {
    return i1 > nq || j1 > nk || (right >= 0 && j1 - 1 > i0 + offset() + right) ||
           (left >= 0 && j0 < i1 - 1 + offset() - left);
  }
  // The key tiles nb of width bn whose every (i, j) the queries [i0, i0 + bm) see: lo <= nb < hi,
  // i.e. tile_partial(i0, i0 + bm, nb * bn, (nb + 1) * bn) == (nb >= hi || nb < lo) for every
  // nb >= 0. Computed once per query tile, so that a key loop tests two registers per tile
  // instead of tile_partial's window bounds, which the compiler reloads from the parameters
  // every iteration (an LDC and its latency per key tile: ~4% of the forward's stall samples at
  // d = 128 N = 8k causal, ncu, bench/NOTES.md session 15).
  __host__ __device__ __forceinline__
  void full_blocks(int i0, int bm, int bn, int& lo, int& hi) const {
    // top: (nb + 1) * bn <= min(nk, i0 + offset() + right + 1)
    const int top = right >= 0 ? min(nk, i0 + offset() + right + 1) : nk;
    hi = i0 + bm > nq || top < 0 ? INT_MIN : top / bn;
    // bottom: nb * bn >= i0 + bm - 1 + offset() - left
    const int bottom = left >= 0 ? i0 + bm - 1 + offset() - left : 0;
    lo = bottom <= 0 ? 0 : (bottom + bn - 1) / bn;
  }
  // The same for a key-outer loop: the query tiles mb of height bm whose every (i, j) sees the
  // keys [j0, j0 + bn), lo <= mb < hi, i.e. tile_partial(mb * bm, (mb + 1) * bm, j0, j0 + bn) ==
  // (mb < lo || mb >= hi) for every mb >= 0 (checked on the CPU against tile_partial for 300k
  // random masks and tile shapes, bench/NOTES.md session 15).
  __host__ __device__ __forceinline__
  void full_query_blocks(int j0, int bn, int bm, int& lo, int& hi) const {
    const int j1 = j0 + bn;
    hi = nq / bm;  // whole query tiles: (mb + 1) * bm <= nq
    lo = 0;
    if (right >= 0) {  // the tile's first query sees its last key: mb * bm >= j1 - 1 - offset() - right
      const int t = j1 - 1 - offset() - right;
      lo = t <= 0 ? 0 : (t + bm - 1) / bm;
    }
    if (left >= 0) {  // its last query sees its first key: mb * bm + bm - 1 <= j0 - offset() + left
      const int u = j0 - offset() + left - bm + 1;
      hi = min(hi, u < 0 ? 0 : u / bm + 1);
    }
    if (j1 > nk) hi = INT_MIN;  // a key tile past the sequence's end: every query tile is cut
  }
};

// cp.async a ROWS x D tile (row pitch D + 8 in smem) from global rows with stride `row_stride`;
// rows >= valid_rows are zero-filled (never read from global).
template <typename T, int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, int64_t row_stride,
                                          int valid_rows, int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += NTHREADS) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid_rows;
    cp_async_16(smem + r * (D + 8) + col, ok ? gmem + r * row_stride + col : gmem, ok);
  }
}

// Row-statistic index of (b, h, row) for lse / stats / rowstate.
__device__ __forceinline__ int64_t rowstat_index(const AttnParams& p, int b, int h, int row) {
  return b * p.rs_batch_stride + h * p.rs_head_stride + row;
}

// dq_accum of the Hopper backward (bwd_kv_sm90.cuh -> dq_finish_kernel): fp32, per head, 64-row
// tiles of 64 x D, each written by one bulk reduce-add per warpgroup. Sequence b's tiles start at
// tile (rows before b + 64 b) / 64, so every sequence starts a fresh tile whatever the varlen
// offsets (FlashAttention-3 pads its dQ accumulator the same way). gproj_cuda/ops.py allocates
// heads * dq_accum_tiles * 64 * D floats, zero-filled.
// (kRows 80: fa3 mode's 80-row d = 128 pass, GPROJ_BWD_VARIANT 39, whose tiles are 80 x D in
// dQ^T's accumulator order, dq_accum_t_coord; the same padding rule: sequence b's tiles
// floor((rows before b + 80 b) / 80) .. hold its ceil(nq / 80) tiles without overlapping b + 1's,
// since floor(x + y) >= floor(x) + floor(y) and floor((nq + 80) / 80) >= ceil(nq / 80).)
template <int kRows = 64>
__host__ __device__ __forceinline__ int dq_tile_base(const AttnParams& p, int b, int q_start) {
  return ((p.cu_seqlens_q ? q_start : b * p.seqlen_q) + kRows * b) / kRows;
}
template <int kRows = 64>
__host__ __device__ __forceinline__ int dq_accum_tiles(const AttnParams& p) {
  return ((p.cu_seqlens_q ? p.total_q : p.batch * p.seqlen_q) + kRows * p.batch + kRows - 1) / kRows;
}
// Inside a tile, warpgroup w's half (64 rows x D/2 columns) holds its WGMMA accumulator in
// register order: value i of lane t at (i / 4) * 512 + 4 t + i % 4, so that each lane stores
// float4s and consecutive lanes fill consecutive 16 bytes.
__host__ __device__ __forceinline__ int dq_accum_offset(int w, int D, int i, int t) {
  return w * (32 * D) + (i / 4) * 512 + 4 * t + (i % 4);
}
// ... and back: the (row, column) of offset `idx` of a tile. The m64nNk16 accumulator: lane t
// (warp t / 32) holds value i = e0 + 2 e1 + 4 e2 at row 16 (t / 32) + (t % 32) / 4 + 8 e1,
// column 2 (t % 4) + e0 + 8 e2 of its warpgroup's half.
__host__ __device__ __forceinline__ void dq_accum_coord(int idx, int D, int& row, int& col) {
  const int w = idx / (32 * D), rem = idx % (32 * D);
  const int t = (rem % 512) / 4, i = 4 * (rem / 512) + rem % 4;
  row = 16 * (t / 32) + (t % 32) / 4 + 8 * ((i >> 1) & 1);
  col = w * (D / 2) + 2 * (t % 4) + (i & 1) + 8 * (i >> 2);
}
// The 80-row tiles (kRows 80 above): warpgroup w's part is its m64n80 accumulator of dQ^T (rows:
// head-dim columns w D/2 .. w D/2 + 63, columns: the tile's 80 queries; D = 128 only), value i of
// lane t at (i / 4) * 512 + 4 t + i % 4 as above, 5120 floats per warpgroup. So the same lane and
// value give the transposed coordinate: query 2 (t % 4) + (i & 1) + 8 (i >> 2), head-dim column
// w D/2 + 16 (t / 32) + (t % 32) / 4 + 8 ((i >> 1) & 1). tests/host/dq_accum_layout.cu checks it
// against CuTe's partition of the pass's dQ^T MMA.
__host__ __device__ __forceinline__ void dq_accum_t_coord(int idx, int D, int& row, int& col) {
  const int w = idx / (40 * D), rem = idx % (40 * D);
  const int t = (rem % 512) / 4, i = 4 * (rem / 512) + rem % 4;
  row = 2 * (t % 4) + (i & 1) + 8 * (i >> 2);
  col = w * (D / 2) + 16 * (t / 32) + (t % 32) / 4 + 8 * ((i >> 1) & 1);
}

// The split group's workspace (AttnParams::kv_head_splits, params.h's dkv_accum) starts at zero:
// the pre-pass that writes rowstate (delta_kernel; gproj: the λ pre-pass) zeroes it, its block
// for query tile `tile` of `tiles` and head h one share of the kv head's sums (share 0 also the
// key-tile counters), nthreads threads from tid, before it counts its rows: the KV-outer blocks
// add into them only after waiting for the pair's rows. (Instead of a memset of the whole
// workspace before: 33.5 MB at B·N = 16k, H_k·d = 256.)
__device__ __forceinline__ void zero_split_sums_share(const AttnParams& p, int b, int h, int tile,
                                                      int tiles, int tid, int nthreads) {
  const int group = p.heads / p.heads_k, hk = h / group;
  const int64_t tiles_k = dkv_tiles_per_head(p);
  const int64_t tile0 = (int64_t(b) * p.heads_k + hk) * tiles_k;
  const int64_t n4 = tiles_k * dkv_tile_floats(p) / 4;
  const int64_t shares = int64_t(group) * tiles;
  const int64_t share = int64_t(h - hk * group) * tiles + tile;
  float4* sums = reinterpret_cast<float4*>(p.dkv_accum) + tile0 * dkv_tile_floats(p) / 4;
  for (int64_t i = n4 * share / shares + tid; i < n4 * (share + 1) / shares; i += nthreads)
    sums[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (share == 0) {
    int* counts = reinterpret_cast<int*>(reinterpret_cast<float*>(p.dkv_accum) +
                                         dkv_key_tiles(p) * dkv_tile_floats(p)) + tile0;
    for (int64_t i = tid; i < tiles_k; i += nthreads) counts[i] = 0;
  }
}

}  // namespace gproj
