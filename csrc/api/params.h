// The one struct that crosses from Python to the kernels.
//
// Python fills it from tensors (device pointers, shapes, strides in elements, the CUDA stream);
// no PyTorch C++ header is involved, so one build serves every PyTorch version. The C++ side
// re-checks everything a kernel relies on (validate.cpp) before launching.
#pragma once
#include <cstdint>

namespace gproj {

enum class DType : int { kBF16 = 0, kFP16 = 1 };
enum class Numerics : int { kGProj = 0, kFA3 = 1 };

struct AttnParams {
  // ---- tensors (device addresses; 0 = absent) -------------------------------------------
  // Layout of q/k/v/out/dout/dq/dk/dv: [batch][row][head][dim], last dim contiguous;
  // varlen tensors are [total_rows][head][dim] and use batch stride 0 + cu_seqlens offsets.
  uint64_t q = 0, k = 0, v = 0, out = 0;
  uint64_t dout = 0, dq = 0, dk = 0, dv = 0;
  uint64_t dk_accum = 0;      // optional fp32 dK before its final cast (same strides as dk)
  // gproj's Hopper backward with A in one part (csrc/prepost/dk_project.cuh): its fp32 dK before
  // the zero-sum projection (dk_stride; may be dk_accum), and per 64 keys (one consumer warpgroup
  // of its KV-outer pass) Σ_j dK_j and Σ_j ||dK_j||: fp64 [batch][head_k][ceil(seqlen_k / 64)]
  // [head_dim + 1].
  uint64_t dk_unprojected = 0, dk_keysum = 0;
  // Per-query-row fp32 state, indexed [b * rs_batch_stride + h * rs_head_stride + row]:
  uint64_t lse = 0;           // natural-log LSE of the user's scores (+inf: row sees no key)
  uint64_t stats = 0;         // float2 {raw score max, log2(row sum)}: forward -> backward
  // float4 {delta, lambda hi, lambda lo, delta + lambda (Hopper λ pass; else 0)}: dQ pass -> dK/dV
  // pass (fa3 mode's delta_kernel: {delta, lse2, 0, 0})
  uint64_t rowstate = 0;
  uint64_t k_shift = 0;       // [batch][head_k][dim] in the input dtype: exact key centering
  uint64_t q_shift = 0;       // [batch][head][dim]: query centering inside the dK GEMM
  uint64_t k_centered = 0;    // centering pre-pass output K' = K - k_shift (kc_stride; 0: skip)
  // int32 [batch][head_k], optional. Centering pre-pass: set, it writes K' only for the (sequence,
  // kv head) pairs with a nonzero shift and records which (1) here. Forward: with k_centered set,
  // the kernels read K' where no flags are given or the flag is 1, else K (= K' there).
  uint64_t k_center_flags = 0;
  // Centering pre-pass scratch: 2 * batch * head_k * dim + 4 uint32, zeroed by the pre-pass's
  // memset; the word after the ranges stays 0 for the forward's tile counter (tile_counter_zeroed).
  uint64_t center_workspace = 0;
  // Centering pre-pass: 1 = k_shift holds the shift already (the forward's, handed to the
  // backward), so the range pass is skipped and only K' (and k_center_flags) are written.
  int k_shift_given = 0;
  // Centering pre-pass: 1 = the rule for the queries (the dK GEMM's operand, never the scores):
  // shift by the rounded midpoint wherever it exceeds an eighth of the coordinate's range, the
  // subtraction rounded where inexact (center_keys.cuh says why); 0 = the keys' exact rule.
  int center_approx = 0;
  uint64_t q_centered = 0;    // Q' = Q - q_shift (qc_stride): the Hopper backward's dK operand
  // int32 [batch][head], optional: k_center_flags for the queries (a lazy pre-pass on Q; the
  // Hopper backward then reads Q' only where the flag is 1, else Q = Q' there).
  uint64_t q_center_flags = 0;
  uint64_t cu_seqlens_q = 0, cu_seqlens_k = 0;   // int32 [batch + 1]; 0 = dense
  // Partial-pass accumulators (context parallelism, gproj_cuda/distributed.py; see `partial`):
  uint64_t dq_accum = 0;      // fp32, dq_stride: += dS~ K (unscaled)
  uint64_t pk_accum = 0;      // fp32, dq_stride: += P~ K (gproj)
  uint64_t rs_accum = 0;      // double2 per query row (rowstat index): += {r, s} (gproj)
  uint64_t dv_accum = 0;      // fp32, dv_stride: += dV (dK goes to dk_accum, += alpha dK)
  uint64_t out_f32 = 0;       // forward: if set, O goes here in fp32 (o_stride) instead of `out`
  // Forward, optional: one int32 of scratch for the persistent sm90 forward's tile counter under a
  // mask (query tiles handed out dynamically; the launch zeroes it on its stream first). 0: tiles
  // are dealt round robin.
  uint64_t tile_counter = 0;
  // 1: tile_counter already holds 0 (the centering workspace's spare word, zeroed earlier in the
  // stream), so the launch does not memset it: the forward then directly follows the centering
  // pass's kernel, whose programmatic dependent it is (session 30).
  int tile_counter_zeroed = 0;
  // Hopper backward, optional: int32 scratch, two per (sequence, kv head), zeroed by the launch.
  // [pair]: the query rows whose rowstate the λ (+ dQ) pass (gproj) or delta_kernel (fa3 mode)
  // has written, and dq_accum's zeros where there is one, summed over the kv head's query heads;
  // [pairs + pair]: the keys whose outputs the KV-outer pass has finished: fp32 dK and key sums
  // (gproj; + 1 once the pair's key-sum total is in slot 0), dQ's reduce-adds (fa3 mode, and
  // gproj at d = 256). With it each pass is launched as the previous one's programmatic dependent and
  // starts under its last wave, every block once its pair's count is complete
  // (csrc/common/pdl.cuh). 0: one after the other.
  uint64_t pair_counters = 0;
  // Hopper backward, dense, GQA (fa3 mode; gproj at d = 256): the kv head's query heads split
  // over kv_head_splits blocks per key tile (each adds its fp32 dK / dV partials into the tile's
  // slot of dkv_accum; the tile's last block stores the sums: sum_split_partials in
  // bwd_kv_common_sm90.cuh).
  // dkv_accum: fp32 [batch][heads_k][ceil(seqlen_k / K)][2][K x head_dim] (dK, dV in
  // accumulator order; K = dkv_tile_keys: the KV-outer pass's key tile), then one int32 counter
  // per key tile;
  // dkv_accum_bytes its size (checked against hopper_dkv_accum_bytes, below); the pre-pass that
  // writes rowstate zeroes it (delta_kernel; gproj: the λ pre-pass). 1: one block per key tile
  // and kv head.
  int kv_head_splits = 1;
  uint64_t dkv_accum = 0;
  int64_t dkv_accum_bytes = 0;

  // ---- strides in elements: {batch, row, head} ------------------------------------------
  int64_t q_stride[3] = {0, 0, 0}, k_stride[3] = {0, 0, 0}, v_stride[3] = {0, 0, 0};
  int64_t o_stride[3] = {0, 0, 0}, do_stride[3] = {0, 0, 0}, dq_stride[3] = {0, 0, 0};
  int64_t dk_stride[3] = {0, 0, 0}, dv_stride[3] = {0, 0, 0}, kc_stride[3] = {0, 0, 0};
  int64_t qc_stride[3] = {0, 0, 0};
  int64_t rs_batch_stride = 0, rs_head_stride = 0;

  // ---- problem --------------------------------------------------------------------------
  int batch = 0, heads = 0, heads_k = 0, head_dim = 0;
  int seqlen_q = 0, seqlen_k = 0;       // dense lengths, or the maxima for varlen
  int total_q = 0, total_k = 0;         // varlen: rows of the packed q and k tensors
  float softmax_scale = 0.f;
  int window_left = -1, window_right = -1;  // -1 = unbounded; causal is right = 0
  // A causal mask or a window (the dispatch's tile orders and shapes depend on it).
  bool masked() const { return window_left >= 0 || window_right >= 0; }
  // Extra shift of the mask's diagonal: query i sits at key position i + (nk - nq) + diag_shift.
  // A query chunk at global position oq against a key chunk at ok: diag_shift = oq - ok - nk + nq.
  int diag_shift = 0;
  // Set by the dispatcher: the order in which one-tile sm90 blocks take their tiles under a
  // causal-like mask (GPROJ_TILE_ORDER, csrc/api/variants.h; tile_grid / grid_tile in
  // csrc/common/tile.cuh), the device's SM count and L2 size; by each sm90 launch: its grid's
  // layout.
  int tile_order = 0;
  int fwd_ab = 0;  // GPROJ_FWD_AB (csrc/api/variants.h)
  int num_sms = 0, l2_bytes = 0;
  int grid_rank_major = 0;
  // Set by tile_grid on a launch's copy: a 1-D grid of groups of grid_group (sequence, head)
  // pairs (0: not so), grid_tiles tiles per pair, grid_heads heads (csrc/common/tile.cuh).
  int grid_group = 0, grid_tiles = 0, grid_heads = 0;
  // Set by fa3 mode's d = 64 / 128 KV-outer launch on its copy: 1 = a block takes its
  // items tile-major, from its last query tile down, its group's query heads inner
  // (KeyBlockWork, bwd_kv_common_sm90.cuh); 0 = head-major, each head's tiles in order.
  int kv_tiles_outer = 0;
  // Set by a varlen launch on its copy: its one-tile grid is of slots of this many rows
  // (slot_grid / slot_tile, csrc/common/tile.cuh); 0: a grid of tiles, heads and batch.
  int slot_rows = 0;
  // Backward passes to run: 1 = dQ pass, 2 = dK/dV pass, 3 = both; 4 = the Hopper λ pre-pass
  // alone (experimental, writes rowstate; csrc/backward/bwd_lambda_sm90.cuh); 8 = the Hopper
  // backward (pre-pass, KV-outer pass with dQ summed into dq_accum / pk_accum, dQ finish;
  // csrc/backward/bwd_kv_sm90.cuh).
  int backward_passes = 3;
  // 1: the backward passes do not finish the gradients of this (query chunk, key chunk) pair;
  // they ADD fp32 partials into the *_accum buffers (every element owned by one block, chunks
  // in stream order: deterministic, no atomics). The dQ pass writes rowstate = {delta, 0, 0}: the
  // caller sets lambda = r / s once every key chunk has been seen, and runs the dK/dV passes
  // with it (SPEC section 3 needs r_i and s_i over *all* keys of row i).
  int partial = 0;
  int dtype = 0;                          // DType
  int numerics = 0;                       // Numerics
  int device = 0;
  int arch = 0;                           // set by the dispatcher: 10 * major + minor
  uint64_t stream = 0;                    // cudaStream_t
};

// dkv_accum of the split group (AttnParams::kv_head_splits; bwd_kv_sm90.cuh, bwd_kv_dkvt_sm90.cuh,
// gproj's bwd_kv_split_sm90.cuh): per key tile of dkv_tile_keys keys (the KV-outer pass's blocks:
// 128 at d = 64 / 128, 80 in fa3 mode's transposed d = 256 pass, 64 in gproj's head-dim-split
// one) and (sequence, kv head), dK's then dV's fp32 partial sums in the accumulator order of the
// block's 256 consumer threads (value i of thread t at (i / 4) * 1024 + 4 t + i % 4: float4
// reductions, a warp's 512 contiguous bytes), then one int32 counter per key tile.
// gproj_cuda/ops.py allocates hopper_dkv_accum_bytes (_dkv_accum_bytes); zero_split_sums_share
// (csrc/common/tile.cuh) zeroes them. (Host and device: params.h is also compiled by the host
// compiler, for the binding.)
#ifdef __CUDACC__
#define GPROJ_HOST_DEVICE __host__ __device__
#else
#define GPROJ_HOST_DEVICE
#endif
GPROJ_HOST_DEVICE constexpr int dkv_tile_keys(int head_dim, bool gproj) {
  return head_dim == 256 ? (gproj ? 64 : 80) : 128;
}
GPROJ_HOST_DEVICE inline int dkv_tile_keys(const AttnParams& p) {
  return dkv_tile_keys(p.head_dim, p.numerics == int(Numerics::kGProj));
}
GPROJ_HOST_DEVICE inline int64_t dkv_tiles_per_head(const AttnParams& p) {
  const int keys = dkv_tile_keys(p);
  return (p.seqlen_k + keys - 1) / keys;
}
GPROJ_HOST_DEVICE inline int64_t dkv_key_tiles(const AttnParams& p) {
  return int64_t(p.batch) * p.heads_k * dkv_tiles_per_head(p);
}
GPROJ_HOST_DEVICE inline int64_t dkv_tile_floats(const AttnParams& p) {
  return int64_t(2) * dkv_tile_keys(p) * p.head_dim;
}
inline int64_t hopper_dkv_accum_bytes(const AttnParams& p) {
  return dkv_key_tiles(p) * (dkv_tile_floats(p) * int64_t(sizeof(float)) + int64_t(sizeof(int)));
}

}  // namespace gproj
