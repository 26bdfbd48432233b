// The environment switches that pick a kernel variant (A/B measurements, oracle runs), shared by
// the dispatch (tile_configs.cuh) and the validation (launch.cu).
#pragma once
#include <cstdlib>

#include "params.h"

namespace gproj {

// GPROJ_FORCE_SM80=1 runs the mma.sync kernels on Hopper too (the oracle for the sm90 ones).
inline bool force_sm80() {
  const char* v = std::getenv("GPROJ_FORCE_SM80");
  return v != nullptr && v[0] == '1';
}

// The value of environment variable `name` where it is a plain decimal number (digits only, no
// leading zero) in [lo, hi]; else 0 (unset, or a value no switch knows).
inline int env_int_in(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] < '1' || v[0] > '9') return 0;
  int x = 0;
  for (const char* c = v; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || x > hi) return 0;
    x = 10 * x + (*c - '0');
  }
  return x >= lo && x <= hi ? x : 0;
}

// GPROJ_FWD_VARIANT=1..12: experimental sm90 forward variants for A/B measurements
// (fwd_sm90.cuh, run_forward: no pingpong, O-rescale skipping flipped, persistence flipped,
// kBlockN 176, three consumer warpgroups, three with P through shared memory on 192- / 160-key
// tiles; 8: variant 0's kernel at every shape, without forward_impl's choices of three
// warpgroups at d = 64 and of one-tile blocks or 176-key tiles at d = 128 in tile_configs.cuh;
// 9: kBlockN 176 at d = 128 without persistence; 10: the other order of the K wait and the
// pingpong turn (the default's: before the turn at d = 64 and 128 since session 18, after it at
// d = 256), on the kernel the default runs from N = 2k); 11: that kernel with the P.V wait at the
// top of the next iteration (the form before session 31; bf16 only, else the default); 12: at
// d = 64 the two-warpgroup kernel with P.V waited for after the softmax (the form before session
// 32; bf16 only); 0 or unset: the default.
// Built with GPROJ_FWD_VARIANTS=OFF (GPROJ_NO_FWD_VARIANTS) only the default exists.
inline int fwd_variant() {
#ifdef GPROJ_NO_FWD_VARIANTS
  return 0;
#else
  return env_int_in("GPROJ_FWD_VARIANT", 1, 12);
#endif
}

// GPROJ_TILE_ORDER (A/B runs): the order of the one-tile sm90 blocks (the non-persistent forward,
// the backward passes) under a causal-like mask (grid_tile, csrc/common/tile.cuh):
//   0 or unset: grids of at most four waves take every pair's longest tile first (session 12);
//      longer grids: the forward's by groups of pairs whose K and V fit half of L2, each group's
//      longest tiles first, the remainder group first (the persistent forward's schedule puts
//      its remainder group first too; session 32); the backward's pair after pair, each pair's
//      longest tile first;
//   1: shortest first within each pair (the forward's and the Q-outer pass's order before
//      session 8);
//   2: longest first within each pair, pair after pair, at every grid size (sessions 8-11);
//   3: the forward's orders of sessions 12-31: beyond four waves longest first within each pair,
//      pair after pair; the persistent schedule's remainder group last.
inline int tile_order() {
  const char* v = std::getenv("GPROJ_TILE_ORDER");
  return v != nullptr && v[0] >= '1' && v[0] <= '3' && v[1] == '\0' ? v[0] - '0' : 0;
}

// GPROJ_FWD_AB (A/B runs, a bit mask; the sm90 forward's choices that are runtime flags):
//   1: retired in session 15 (the producer loaded K and V of a tile together, before session 13;
//      K a tile ahead measured faster, and the switch cost the producer's thread a register);
//   2: the consumers store O with their own 16-byte stores (before session 13), not by TMA;
//   4: varlen grids as long as the longest sequence in every sequence (before session 14), not
//      slots of real tiles (slot_grid, csrc/common/tile.cuh); this bit applies to every varlen
//      pass of one-tile blocks, the backward's and the centering pre-pass's too;
//   8: the persistent forward deals its query tiles round robin under a mask too (before
//      session 15), instead of handing them out from a tile counter (AttnParams::tile_counter);
//  16: the persistent forward under a mask schedules one (sequence, head) pair at a time (the
//      one-tile grid's order), not groups of pairs whose K and V fill half of L2;
// 1024: the persistent forward without a mask schedules groups of pairs whose K and V fill half
//      of L2, the pairs fastest (before session 34), not one pair at a time;
//  32: (backward) the Hopper passes store dK, dV (and gproj's Q-outer pass dQ) from their
//      accumulators, 4 bytes per store (before session 19), not through shared memory
//      (stage_and_store_rows, csrc/common/sm90.cuh);
//  64: the keys' centering range pass reads every row (before session 25), without the probe that
//      stops it where a block's first rows already leave every coordinate unshifted
//      (csrc/prepost/center_keys.cuh);
// 128: gproj's forward and the centering pre-pass's second kernel launched one after the other,
//      not as programmatic dependents of the kernel before, and the persistent forward's tile
//      counter zeroed by its own memset, not with the centering workspace (session 30).
// 256: the sm90 forward's query tiles start at row 0 under a causal-like mask too (before session
//      33), not shifted so that the partial tile is the first (FwdKernelParams::partial_first);
// 512: the sm90 forward masks every key tile of a query tile with padding rows (past the
//      sequence's end; before session 33), not only the tiles some stored row does not fully see;
// 2048: the persistent forward's O-store thread waits for the store's shared-memory reads right
//      after issuing it (before session 32), not after the next tile's first GEMM issue.
// 4096: gproj's d = 256 forward launched as the programmatic dependent of the centering pass's
//      second kernel too (d = 64 and 128 are since session 30; at d = 256 it measured 1-2% slower
//      on the one-tile kernel then; session 36's A/B on the persistent one).
// Written as a decimal number (1 to 8191).
inline int fwd_ab() {
  const char* v = std::getenv("GPROJ_FWD_AB");
  if (v == nullptr) return 0;
  char* end = nullptr;
  const long bits = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && bits >= 1 && bits <= 8191 ? int(bits) : 0;
}

// GPROJ_BWD_VARIANT for A/B runs of the gproj Hopper backward (fa3 mode: only variant 9):
//   0 or unset: the λ + dQ Q-outer pass, then the KV-outer pass with A in one rounded part and
//      dK projected onto Σ_j dK_j = 0 (dk_project.cuh);
//   3: the same with A in three parts, the mma.sync passes' form (no projection);
//   4: the session-4 design: a λ-only pre-pass, dQ in the KV-outer pass (dq_accum, dq_finish),
//      A in two parts;
//   5: the default with three consumer warpgroups in the KV-outer pass at d = 64 instead of two
//      (rounded A; the default until session 8);
//   6: the default with A in two parts (no projection: session 6's default);
//   7, 8: the default with 64-key (3 stages; the default until session 8) or 128-key (2 stages)
//      tiles in the d = 64 Q-outer pass instead of 96 (3 stages);
//   9: the default with 64-row query tiles in the d = 64 KV-outer pass instead of 128 (gproj:
//      the default until session 8; fa3 mode: until session 11);
//  10: the default with 96-row query tiles in the d = 64 gproj KV-outer pass instead of 128 (the
//      default until session 11);
//  11: the default with each pass at d = 64 / 128 launched after the previous one has ended, not
//      as its programmatic dependent under its last wave (AttnParams::pair_counters; the default
//      until session 21 in gproj, until session 22 in fa3 mode);
//  12: the default's counts and waits, but each pass launched after the previous one has ended
//      (what the counting costs without the overlap);
//  13: (fa3 mode, d = 64; session 25) each consumer warpgroup of the KV-outer
//      pass adds its own keys' share of dQ over the whole head dim, and the two take pingpong
//      turns instead of meeting every tile (BwdKvTraits::kDqPerWg).
//  14: (fa3 mode, d = 128; session 26) the same per-warpgroup dQ in the 64-row d = 128 pass, with
//      one dQ staging buffer per warpgroup (two of the whole tile do not fit beside K and V).
//  15: (fa3 mode, d = 64) the KV-outer pass's dQ GEMM split between the consumer warpgroups by
//      head-dim halves (m64n32k16 over all 128 rows; the default until session 26) instead of by
//      query rows (m64n64k16 each, BwdKvTraits::kDqSplitM).
//  16: (fa3 mode, d = 256) the head-dim-split KV-outer pass on 64-key blocks
//      (bwd_kv_split_sm90.cuh; the default until session 28) instead of 80-key blocks with dK and
//      dV computed transposed (bwd_kv_dkvt_sm90.cuh).
//  17: (fa3 mode, d = 256, no mask) the 80-key pass with its tile's first dQ slice before dV, as
//      under a mask (the default until session 29), instead of dV first (kDvFirst).
//  18: (fa3 mode, d = 128) the 64-row pass waiting for dP before computing P and forming lse2
//      from the stats (the default until session 37) instead of computing P under dP with lse2
//      from rowstate, as FlashAttention-3's backward does (BwdKvTraits::kFa3Ab).
//  19: (fa3 mode, every head dim but 256) the KV-outer pass's blocks pair after pair under a
//      causal-like mask (the default until session 37) instead of by groups of pairs
//      (BwdKvTraits::kGroupedGrid).
//  20: (fa3 mode, d = 64 / 128, session 38) GQA under a causal-like mask: the KV-outer blocks
//      take their items tile-major, from the last query tile down with the group's query heads
//      inner, instead of head after head (KeyBlockWork::tiles_outer, bwd_kv_common_sm90.cuh).
//  21: (fa3 mode, d = 64 / 128, session 38) the same order under any causal-like mask, GQA or
//      not (with one query head per kv head: from the last query tile down).
//  22: (fa3 mode, dense GQA; session 38, d = 256 since 40) one block per query head and key tile, as
//      FlashAttention-3's GQA backward, instead of one per kv head walking its group: the blocks'
//      fp32 dK / dV partials summed in a workspace, the tile's last block storing the totals
//      (AttnParams::kv_head_splits; gproj_cuda/ops.py sets it, also from GPROJ_BWD_KV_SPLITS=S:
//      S shares of the group per key tile, with any variant). At d = 256 (the transposed pass)
//      one block per query head is the default since session 40. gproj at d = 256 (its
//      head-dim-split pass, 64-key tiles; session 41, not yet measured): GPROJ_BWD_KV_SPLITS=S
//      alone, with any of its variants; one block per group by default.
//  23: (fa3 mode, d = 128, session 38) the KV-outer pass's diagonal tiles masked by key-row
//      ranges (Mask::row_queries, the d = 64 pass's form) instead of the per-element test; the
//      default since session 42.
//  24: (fa3 mode, d = 64 / 128, session 39) the KV-outer pass frees a tile's Q / dO stage at the
//      tile's end, once its dK GEMM is done, instead of after the next tile's S
//      (BwdKvTraits::kStageFreedAtEnd).
//  25: (fa3 mode, d = 64 / 128, session 39) variant 24 with dO in a ring of its own, waited for
//      by dP alone and freed once the tile's dV is done, as FlashAttention-3's backward
//      (BwdKvTraits::kSplitDoPipe).
//  26: (fa3 mode, d = 64, session 39) the 128-row KV-outer pass stores its dS~ by one 32-bit
//      shared address per lane and constants, as the 64-row pass does, instead of CuTe's copy
//      (BwdKvTraits::kFa3Ab bit 32).
//  27: (fa3 mode, d = 64 / 128, session 39) 24 and 26 together (d = 128: 24); at d = 64 the
//      default since session 39 (24-26 there are each alone, against variant 31).
//  28: (fa3 mode, d = 256, session 39) the 80-key pass computes P while dP is on the tensor
//      cores, lse2 from rowstate (bwd_kv_dkvt_sm90_kernel's kAb bit 1), as the d = 128 pass;
//  29: (the same pass) P~ and dS~ stored by two per-lane base addresses and constants
//      (stmatrix_rows_at; kAb bit 2); 30: 28 and 29 together (the default since session 39).
//  31: (fa3 mode, d = 64 and 256, session 39) the KV-outer passes as they were before session 39's
//      defaults: d = 64's stage freed after the next tile's S and dS~ stored through CuTe's copy
//      (variant 27's form is the default), d = 256's P after dP and stores through the layout.
//  32: (fa3 mode, d = 256, session 40; 0 +- 0.7% in session 42's A/B) the 80-key pass's dK^T /
//      dV^T GEMMs issued per m64 atom, with the dQ slices and their reduce-adds between them, in
//      FlashAttention-3's order (its SASS): the reduce-adds' registers drain while dK / dV
//      atoms run (bwd_kv_dkvt_sm90_kernel's kAb bit 4).
//  33: (fa3 mode, every head dim, session 41; measured in session 42, not kept) each KV-outer
//      block takes its heads' query tiles from its own diagonal tile on, cyclically
//      (KeyBlockWork::rot), instead of from the first: without a mask a head's blocks then no
//      longer reduce-add into the same dq_accum tile (and read the same Q / dO tile) in step;
//      under a causal mask the diagonal is already each block's first tile (no change there).
//      Compiled in only there (kFa3Ab bit 64, the d = 256 pass's kAb bit 8): the runtime
//      rotation cost the d = 64 pass 16 bytes of spill.
//  34: (fa3 mode, d = 256, session 42) the 80-key pass masks the tiles the mask cuts by key
//      ranges per query row (Mask::row_columns, mask_row_ranges: one compare and one select per
//      score) instead of visible() per score (kAb bit 16); 36: 34 with the block's parts of each
//      tile's dq_accum and rowstate addresses formed once (kAb bit 32), the default since
//      session 42; 35: 32 and 36 together. None changes a value: dK and dV bitwise.
//  37: (fa3 mode, d = 64 / 128, session 42) every consumer warp of the KV-outer pass copies a
//      share of a tile's row state (delta, lse2), instead of the first warp of each warpgroup
//      (BwdKvTraits::kRowsAllWarps, kFa3Ab bit 128). Measured 2-5% slower at d = 64, mixed at
//      d = 128 (H100): kept for the record.
//  38: (fa3 mode, d = 128 / 256, session 42) the defaults before session 42: d = 128's diagonal
//      tiles masked per element (variant 23's row ranges are the default since), d = 256's
//      session-39 form (variant 36's is the default since).
//  39: (fa3 mode, d = 128, session 44) the KV-outer pass on 80 x 128 tiles with dQ computed
//      transposed (BwdKvTraits::kDqT; FlashAttention-3's d = 128 tile without a causal mask) and
//      dq_accum in 80-row tiles (tile.cuh). Measured on an H100 (session 44): 2-3% faster at
//      N = 16k without a mask, within 1% at 2k-8k, 5.6% slower under a causal mask.
//  40: (fa3 mode, d = 128, session 45) the default 64-row pass with each tile's lse2 read into
//      registers before the wait for S (BwdKvTraits::kLse2Early, kFa3Ab bit 256) instead of
//      after it; written after ncu, to be measured.
// (Session 42 measured on an H100: variants 23 at d = 128 and 36 at d = 256 the defaults since;
// 32, 33 (d = 64 2-5% slower, d = 128 / 256 within 1%) and 37 not.)
// (13 and 14 measured 7-17% slower than the default, session 26: kept for the record and A/B.)
inline int bwd_variant() {
  return env_int_in("GPROJ_BWD_VARIANT", 3, 40);
}

// fa3 mode's KV-outer item order for a launch (AttnParams::kv_tiles_outer): tile-major under a
// causal-like mask with GQA (variant 20) or with any group (21); else head-major. Not yet the
// default: written in session 38 without a GPU, to be measured (bench/NOTES.md session 38).
inline int kv_tiles_outer(const AttnParams& p) {
  const int v = bwd_variant();
  return p.window_right >= 0 && ((v == 20 && p.heads > p.heads_k) || v == 21) ? 1 : 0;
}

// Whether the gproj Hopper backward rounds A once and projects dK (needs dk_unprojected, dk_keysum).
inline bool hopper_bwd_projects_dk(const AttnParams& p) {
  const int v = bwd_variant();
  return p.numerics == int(Numerics::kGProj) && v != 3 && v != 4 && v != 6;
}

// Whether the Hopper backward (backward_passes = 8) sums dQ in p.dq_accum.
inline bool hopper_bwd_uses_dq_accum(const AttnParams& p) {
  return p.numerics != int(Numerics::kGProj) || p.head_dim == 256 || bwd_variant() == 4;
}

}  // namespace gproj
