// The Hopper (sm_90a) KV-outer backward pass: TMA + WGMMA, warp-specialized (issue 7).
// The default backward where it covers the call: head dims 64 and 128 (d = 256:
// bwd_kv_split_sm90.cuh), fa3 numerics (bf16, fp16) and gproj (bf16); backward_passes = 8 in the
// C API, GPROJ_HOPPER_BWD=0 (and deterministic=True in fa3 mode) in Python take the mma.sync
// passes instead (as does everything this does not cover).
//
// One block = 128 keys of one (sequence, kv head). K and V stay in shared memory; the block walks
// every query head of its GQA group and every 64-row query tile (128 rows at d = 64) that sees
// its keys, and a producer warpgroup streams Q and dO (gproj: and Q') tiles by TMA through a 2-
// (gproj: 3-) stage mbarrier ring. Two consumer warpgroups own 64 keys each (GPROJ_BWD_VARIANT
// 5: three at d = 64, 192-key blocks, 160 registers each). Per query tile (transposed, rows are
// keys):
//   S^T  = K Q^T, dP^T = V dO^T            WGMMA, both operands in shared memory
//   P^T from the saved softmax state, dS^T = P^T (dP^T - delta)          registers, fp32
//   dV  += P~^T dO,  dK += dS~^T Q          WGMMA, A (P~, dS~) straight from registers
//   dQ   = dS~ K                            WGMMA from shared memory (dS~ written there by both
//                                           warpgroups; each computes half of the head dim, or
//                                           at d = 64 its own 64 of the 128 query rows)
//   dq_accum += dQ                          bulk reduce-add of each warpgroup's part from shared
//                                           memory, issued and waited for by a dQ writer warp of
//                                           the producer warpgroup (order varies: not
//                                           deterministic)
// fa3: 5 GEMM-equivalents per (query tile, key tile), as FlashAttention-3.
// gproj (SPEC section 3, the arithmetic of the mma.sync passes and reference.py): delta, lambda
// = r / s (~48-bit row sums of exactly the rounded dS~, P~ the GEMMs consume) and dQ come from the
// Q-outer pass (bwd_lambda_sm90.cuh: S, dP, dS~ K', P~ K', 4 GEMM-equivalents); here A = dS -
// lambda P = P (dP - (delta + lambda)) in fp32, rounded once (kAParts; GPROJ_BWD_VARIANT=6: two
// parts and 3: three, the mma.sync form, both from dS~ - lambda P~ with lambda as hi + lo), dK +=
// A~^T Q' against the centered queries Q' = Q - c_q (loaded by
// TMA beside Q), plus c_q (x) colsum(A) per head (fp32 per tile, fp32 pairs across tiles); dK
// leaves in fp32 and dk_project.cuh removes what the rounding of A left in Σ_j dK_j. S, dP, dV,
// dK: 4 GEMM-equivalents, 8 in all (two parts: 5 and 9; three: 6 and 10). With no dQ here every
// GEMM operand of this pass is in registers or loaded by TMA: the two warpgroups share nothing but
// the Q ring and take turns at the tensor cores (pingpong) instead of meeting at a barrier per
// tile.
// GPROJ_BWD_VARIANT=4 keeps the previous gproj design for A/B runs: a λ-only pre-pass, and dQ
// here as dS~ K - lambda_hi P~ K per key tile (two GEMMs, combined in fp32 registers).
// dK and dV of a key are summed over the whole group inside one block (no atomics; fa3 mode's
// AttnParams::kv_head_splits, an A/B form so far, splits the group over blocks whose fp32
// partials meet in a workspace: sum_split_partials); fa3's dQ is rounded once by
// dq_finish_kernel, its delta comes from delta_kernel (bwd_prepost.cuh).
#pragma once

#include "../api/variants.h"
#include "../backward/bwd_common.cuh"
#include "../common/sm90.cuh"
#include "../common/tile.cuh"
#include "bwd_kv_common_sm90.cuh"
#include "../prepost/dk_project.cuh"

namespace gproj {
namespace sm90 {

template <typename T_, int kHeadDim_, bool kGProj_, int kAParts_ = 3, bool kDqHere_ = !kGProj_,
          int kMmaWGs_ = 2, int kBlockM_ = 64, bool kDqPerWg_ = false, bool kDqSplitM_ = false,
          int kFa3Ab_ = 0>
struct BwdKvTraits {
  using T = T_;
  static constexpr bool kGProj = kGProj_;
  // dQ in this pass (fa3; gproj variant 4) or in gproj's Q-outer pass (the gproj default).
  static constexpr bool kDqHere = kDqHere_;
  // fa3 mode, GPROJ_BWD_VARIANT=13 (session 25; 14 at d = 128, session 26; both measured 7-17%
  // slower than the default, bench/NOTES.md session 26): each consumer warpgroup adds
  // its own keys' share of dQ (dS~ of its 64 keys times their K, the whole head dim) instead of
  // half of the head dim over all the block's keys. The warpgroups then share no operand and need
  // not meet every tile: they take pingpong turns at S and dP as gproj's pass does, so that one's
  // exp2 (MUFU-bound) runs under the other's GEMMs. Twice the reduce-add bytes into dq_accum.
  static constexpr bool kDqPerWg = kDqPerWg_;
  static_assert(!kDqPerWg_ || (kDqHere_ && !kGProj_ && kMmaWGs_ == 2),
                "per-warpgroup dQ: fa3 mode's pass with dQ here, two consumer warpgroups");
  // fa3 mode's 128-row tiles (d = 64), the default since session 26 (GPROJ_BWD_VARIANT=15: the
  // head-dim split, measured 3-5% slower for the whole fa3 backward): the dQ GEMM split
  // between the warpgroups by query rows (each its own 64 rows, the whole head dim, all 128 keys:
  // m64n64k16, FlashAttention-3's AtomLayoutMdQ = 2 there) instead of by head-dim halves
  // (m64n32k16 over all 128 rows). Same FLOPs, a third less shared-memory operand traffic: a
  // shared-memory m64nNk16 reads its 2 KB of A and N x 32 bytes of B in the N / 2 cycles the SM's
  // tensor cores take for it (2048 bf16 FMA per cycle), so n32 needs 192 B/clk and n64 128 B/clk,
  // against the 128 B/clk the SM's shared memory delivers (a model; ncu agrees on the direction:
  // the shared pipe was the pass's most utilized before, the tensor pipe after, bench/NOTES.md
  // session 26).
  static constexpr bool kDqSplitM = kDqSplitM_;
  static_assert(!kDqSplitM_ || (kDqHere_ && !kGProj_ && !kDqPerWg_ && kBlockM_ == 128 &&
                                kMmaWGs_ == 2),
                "dQ split by rows: fa3 mode's 128-row tiles, the warpgroups meeting every tile");
  // Whether the consumer warpgroups meet every tile (dQ from both warpgroups' dS~)
  static constexpr bool kWGsMeet = kDqHere_ && !kDqPerWg_;
  // Consumer warpgroups, 64 keys each. Three (192-key blocks, 160 registers each) only without
  // dQ here (its GEMM splits the head dim between two) and where dK and dV fit: d = 64 (8 bytes
  // of spill; the default in session 6, 2-4% slower than two with A from fp32 in session 8).
  static constexpr int kMmaWGs = kMmaWGs_;
  static_assert(kMmaWGs == 2 || (kMmaWGs == 3 && !kDqHere_ && kHeadDim_ == 64),
                "three consumer warpgroups: gproj at d = 64 only");
  static constexpr int kConsumerRegs = kMmaWGs == 2 ? 240 : 160;
  // gproj: the rounded parts of A that enter the dK GEMM, one GEMM each.
  //   1 (the default): A rounded once; its rows then sum to zero only to bf16 rounding, so the
  //     epilogue writes fp32 dK and dk_project.cuh restores Σ_j dK_j = 0 afterwards (emulator:
  //     dK errors as with two parts, Σ_j dK_j 0.002x the bar; NOTES.md session 7);
  //   2: hi + lo ("2a": the CPU emulator and the H200 grid meet every bar with it, worst Σ_j dK_j
  //     1.4e-6 / 1.6e-6), GPROJ_BWD_VARIANT=6; 3: hi + mid + lo, the mma.sync form, variant 3.
  static constexpr int kAParts = kAParts_;
  static_assert(kAParts >= 1 && kAParts <= 3, "A in 1, 2 or 3 rounded parts");
  // One part: dK leaves in fp32 (p.dk_unprojected) for the zero-sum projection.
  static constexpr bool kProjectsDk = kGProj_ && kAParts == 1;
  // One part with two consumer warpgroups: A from the fp32 P and dS rather than from their
  // rounded copies (no dS~ to round, no unpacking: 2-3 instructions per score fewer), as
  // P (dP - (delta + lambda)), two more fewer (the kernel's dS step says why). With three
  // warpgroups (160 registers) the fp32 values live that long spilled 56 bytes, so there A is
  // still formed from the rounded values.
  static constexpr bool kAFromFp32 = kProjectsDk && !kDqHere_ && kMmaWGs_ == 2;
  // Where p.pair_counters is set (pdl.cuh): launched as the programmatic dependent of the pass
  // that writes rowstate (gproj: the λ + dQ pass; fa3 mode: delta_kernel, which also zero-fills
  // dq_accum), and, fa3 mode, counting the keys whose dQ is added, for dq_finish_kernel. (gproj
  // with dQ here, variant 4, neither: its λ-only pre-pass counts nothing at d = 64 / 128.)
  static constexpr bool kWaitsForRows = kGProj_ ? !kDqHere_ : kDqHere_;
  static constexpr bool kCountsDqKeys = !kGProj_ && kDqHere_;
  // fa3 mode's 128 x 128 tiles (d = 64): lse2 = m c + log2 l taken from rowstate, where
  // delta_kernel formed it once per row, instead of per column and key tile here (an FMUL and an
  // FADD per column: 64 of ~890 instructions per tile). Measured (bench/NOTES.md session 23):
  // -7% for the whole fa3 backward at d = 64; at d = 128 (64-row tiles, 32 such instructions of
  // ~500) +1.2% alone then (its producer warpgroup spilling 32 bytes instead of 28).
  // fa3 mode's 64-row d = 128 pass since session 37: P computed while dP is still on the
  // tensor cores (kPUnderDp) and lse2 taken from rowstate (kLse2InRowstate), as FlashAttention-3's
  // backward does (its SASS: S waited for alone, then exp2 under dP; LSE stored as log2). Each
  // alone measured 0 to +3% slower, both together -3 to -5% (interleaved, bench/NOTES.md session
  // 37; session 11 and 23 had measured each alone). kFa3Ab_ (GPROJ_BWD_VARIANT 18, A/B only):
  // bit 1 waits for dP before P, bit 2 forms lse2 here from the stats, the form before; bit 4
  // (variant 23, session 38, not yet measured) masks the diagonal tiles by key-row ranges, as
  // the 128-row pass does, instead of the per-element test. Bit 8 (variant 24, session 39, both
  // tile heights; kStageFreedAtEnd) frees the Q / dO stage at the end of its tile; with bit 16
  // (variant 25) dO has a ring of its own, freed once dV is done (kSplitDoPipe); bit 32 (variant
  // 26, the 128-row pass only) stores its dS~ by one 32-bit address, as the 64-row pass does.
  // The 128-row pass's default since session 39 is bits 8 + 32 (variant 27's form; 31 the one
  // before). Bit 64 (variant 33, session 41, both tile heights; kRotated): each head's query
  // tiles from the block's own diagonal tile on (KeyBlockWork::rot). Bit 128 (variant 37,
  // session 42, both; kRowsAllWarps): every consumer warp copies a share of a tile's row state.
  static_assert(kFa3Ab_ == 0 || (!kGProj_ && kDqHere_ &&
                                 (kBlockM_ == 64   ? (kFa3Ab_ & 32) == 0 &&
                                                         (!(kFa3Ab_ & 256) || !(kFa3Ab_ & 2))
                                  : kBlockM_ == 80 ? (kFa3Ab_ & ~7) == 0
                                                   : (kFa3Ab_ & ~248) == 0)),
                "the A/B bits are for fa3 mode's 64-row pass (bits 8, 16, 64, 128: also the "
                "128-row one; bit 32: the 128-row one only; bit 256: the 64-row one only, with "
                "lse2 from rowstate; the 80-row one: bits 1, 2, 4 only)");
  static constexpr bool kRotated = (kFa3Ab_ & 64) != 0;
  // Who copies a tile's row state (delta, lse2) into shared memory, a tile ahead. By default the
  // first warp of each consumer warpgroup, 32 (d = 128) or 64 (d = 64) rows, two cp.async each:
  // 37 / 66 SASS instructions a tile on that warp alone (sessions 37, 38), and the warpgroups
  // meet at consumers_sync every tile, where the other seven warps wait for the last one (ncu,
  // d = 64 N = 8k: ~4% of the pass's samples stalled there, on barrier, session 40's files). With
  // kRowsAllWarps each of the 256 consumer threads copies one value (d = 64: one of the 128 rows'
  // two; d = 128: every second thread), so each warp issues the same ~15 more instead.
  static constexpr bool kRowsAllWarps = (kFa3Ab_ & 128) != 0;
  // lse2 of the tile's queries read into registers before the wait for S (kFa3Ab bit 256,
  // variant 40, session 45, the 64-row pass only). Without it the P pass's first FFMAs wait for
  // loads issued after that wait: ncu at d = 128 N = 8k causal (H100, session 45) put 9% of the
  // pass's warp samples on those FFMAs (short scoreboard), the largest single difference from
  // FlashAttention-3's loop, which has its LSE in registers before S is done.
  static constexpr bool kLse2Early = (kFa3Ab_ & 256) != 0;
  static_assert(!(kFa3Ab_ & 16) || (kFa3Ab_ & 8), "dO's own ring only with Q freed at the end");
  static constexpr int kFa3Ab = kFa3Ab_;
  // When a tile's Q / dO stage goes back to the producer. Without bit 8 (the 64-row pass's
  // default): after the next tile's S (and the dK before it) is done, where the wait for S finds
  // it. With two stages the producer's
  // load of tile t + 2 then starts a quarter of a tile (S and dP of t + 1) after the last GEMM
  // that reads tile t's stage (dK) has ended: at d = 64 the 128-row pass waits for dK at the
  // tile's end anyway and holds the stage for nothing. kStageFreedAtEnd (kFa3Ab bit 8) waits for
  // dK at the tile's end (at d = 128 after the dQ staging, which still runs under dK) and frees
  // the stage there, as FlashAttention-3's backward does (its Q release follows its last wait)
  // and as the d = 256 passes do (session 10 measured the deferred form there 2-6% slower).
  // What it costs: at d = 128 the warpgroup no longer queues the next S behind its dK.
  // Measured (session 39): d = 64 -1.1 to -1.8% alone, the default there since (with bit 32);
  // d = 128 within 0.4% either way, and with kSplitDoPipe 1-2% slower: not its default.
  static constexpr bool kStageFreedAtEnd = (kFa3Ab_ & 8) != 0;
  // dO in a ring of its own (kFa3Ab bit 16, variant 25): FlashAttention-3's form, dP waits for
  // dO's stage alone (S only for Q's), and dO's stage is freed as soon as dV, its last reader,
  // is done, about 40% of a tile before Q's.
  static constexpr bool kSplitDoPipe = (kFa3Ab_ & 16) != 0;
  // With lse2 from rowstate, delta and lse2 of a tile's rows sit in two arrays (row_delta,
  // row_lse2), so that a lane's column pair reads each as one 8-byte shared load, in the P and
  // the dS pass, instead of a 16-byte {delta, lse2} pair split by ptxas into two scalar loads in
  // each: 16 loads a tile instead of 32, as FlashAttention-3's separate LSE and dPsum buffers.
  static constexpr bool kLse2InRowstate = !kGProj_ && !(kFa3Ab_ & 2);
  // fa3 mode: under a causal-like mask, grids of more than kGlobalWaves waves go by groups of
  // (sequence, kv head) pairs whose Q, dO and dq_accum fit half of L2, each group's longest key
  // blocks first, then its next longest, ... (tile_grid / grid_tile's groups, the forward's since
  // session 32; FlashAttention-3's backward orders its blocks alike, by sections of heads filling
  // 40 MB), instead of pair after pair (GPROJ_BWD_VARIANT=19), whose last pair's longest blocks
  // start when the other SMs are running out of work: by a greedy-dispatch model (NOTES.md
  // session 37) the grid's end 5.3-6.5% past the mean SM's at d = 128 causal 2k-8k (64 x 128
  // tiles), 0.8-2.6% grouped; d = 64 2.5-2.8% and 0.4-1.1%; 16k alike either way. Measured
  // (interleaved, whole fa3 backward, grouped against pair after pair): d = 128 causal 4k and 8k
  // -1.8%, 16k +0.2% (one pair per group there), GQA 4k -0.5%, but 2k +1.3% (d = 64 2k +2.2%):
  // so from N = 4k only. gproj keeps pair after pair: its passes fill that tail under each
  // other (session 32).
  static constexpr bool kGroupedGrid = !kGProj_;
  using Element = typename CuteElement<T_>::type;
  // With no dS~ / dQ buffers the shared memory holds a third Q / dO / Q' stage (two measured the
  // same, within 2%: NOTES.md session 6).
  // Query tiles of 64 rows; 128 at d = 64 (S^T and dP^T 64 registers each, dK and dV 32; fa3's
  // dQ 32); without dQ here any multiple of 32 (the row-state copy), e.g. 96 (variant 10).
  static constexpr int kHeadDim = kHeadDim_, kBlockN = 64 * kMmaWGs, kBlockM = kBlockM_,
                       kStages = kDqHere ? 2 : 3;
  // With dQ here: 64 rows, or 128 (fa3 at d = 64, FlashAttention-3's 128 x 128 tile there: the
  // dQ tile is two 64-row tiles of dq_accum, one bulk reduce-add each per warpgroup), or 80
  // (kDqT below).
  static_assert((kDqHere_ ? (kBlockM == 64 || kBlockM == 128 || kBlockM == 80) : kBlockM % 32 == 0),
                "query tiles: 64, 80 or 128 rows with dQ here, else a multiple of 32");
  static_assert(kBlockM == 64 || !(kDqHere_ && kGProj_), "gproj with dQ here: 64-row tiles");
  // fa3 mode's 80 x 128 tiles at d = 128 (GPROJ_BWD_VARIANT 39, session 44; FlashAttention-3's
  // tile there without a causal mask: bench/NOTES.md session 38 item 6 counted ~12% fewer
  // instructions per query row than our 64-row loop). S^T and dP^T are m64n80 (40 registers
  // each), dK and dV take k = 80 (five k16 steps). dQ = dS~ K has M = 80, which a warpgroup's
  // WGMMA cannot take (M is 64 per warpgroup), so it is computed transposed, dQ^T = K^T dS~^T
  // (FlashAttention-3's dQ_swapAB): M = the warpgroup's 64 head-dim columns, N = 80 queries, K =
  // the block's 128 keys, 40 registers, both operands in shared memory (K^T MN-major from sK,
  // dS~ MN-major from the dS~ buffer as it is). dq_accum then holds 80-row tiles in dQ^T's
  // accumulator order (tile.cuh: dq_tile_base<80>, dq_accum_t_coord), one 20 KB bulk reduce-add
  // per warpgroup; delta_kernel and dq_finish_kernel are launched for that layout.
  // Shared memory: K, V 64 KB + two Q / dO stages 80 KB + two dS~ stages 40 KB + one dQ staging
  // buffer 40 KB = 224 KB (so one staging buffer, not the 64-row pass's two).
  static constexpr bool kDqT = kBlockM_ == 80;
  static_assert(!kDqT || (kDqHere_ && !kGProj_ && kHeadDim_ == 128 && kMmaWGs_ == 2 &&
                          !kDqPerWg_ && !kDqSplitM_),
                "80-row tiles: fa3 mode at d = 128, dQ transposed by two warpgroups");
  static constexpr int kDqSubTiles = kDqT ? 1 : kBlockM / 64;  // dq_accum tiles per query tile
  // floats: a warpgroup's half of a 64-row tile (kDqT: its 64 head-dim columns of the 80 rows)
  static constexpr int kDqHalf = kDqT ? kBlockM_ * kHeadDim_ / 2 : 64 * kHeadDim_ / 2;
  static constexpr int kDqRows = kDqT ? 80 : 64;  // rows of a dq_accum tile
  // floats a warpgroup stages per item: its half of the head dim, or (kDqPerWg) the whole tile
  static constexpr int kDqWgFloats = kDqPerWg_ ? kBlockM_ * kHeadDim_ : kDqSubTiles * kDqHalf;
  // dQ staging buffers (kDqHere): two in fa3 mode, so that a warpgroup stages tile t while the
  // copy engine still reads tile t - 1 (it waits for tile t - 2's reads, a whole tile earlier);
  // one in gproj mode and at d = 64 (whose 128-row tiles leave no shared memory for it). ncu
  // (session 17, fa3 mode d = 128 N = 4k): the consumers' wait for the single buffer was 10% of
  // the pass's warp samples.
  // (kDqPerWg at d = 128, variant 14: one, of the whole 64 x 128 tile per warpgroup: 64 KB; two
  // would need 128 KB beside K, V, Q, dO and dS~'s 144 KB)
  static constexpr int kDqBuffers =
      kDqHere_ && !kGProj_ && kHeadDim_ == 128 && !kDqPerWg_ && !kDqT ? 2 : 1;
  // Offset (floats) in the staging buffers of item `it`'s dQ half of consumer warpgroup w.
  __device__ static constexpr int dq_stage(int it, int w) {
    return (it % kDqBuffers) * (kMmaWGs_ * kDqWgFloats) + w * kDqWgFloats;
  }
  // kDqHere: the bulk reduce-adds of dQ are issued, and waited for, by a warp of the producer
  // warpgroup (FlashAttention-3's dQ writer), so a consumer warpgroup only waits where its
  // staging buffer is still being read (ncu, session 11: the consumers' own wait and barriers
  // were 12% of the pass's samples at d = 128). The writer lives within the producer
  // warpgroup's 24 registers (see the kernel's setmaxnreg).
  // P computed from S while dP is still on the tensor cores (wait for S only; FlashAttention-3's
  // order). Measured (session 11, interleaved A/B): 1.3-1.7% faster for fa3 at d = 64; at d = 128
  // fa3 0 to +1.6% alone (so there only with lse2 from rowstate, since session 37: see above),
  // gproj d = 64 +1.5 to +3% (with the same change in its Q-outer pass), so not in gproj mode.
  static constexpr bool kPUnderDp = kDqHere_ && !kGProj_ && !(kFa3Ab_ & 1);
  static constexpr int kNumMmaThreads = 128 * kMmaWGs, kNumThreads = kNumMmaThreads + 128;
  using HD = Int<kHeadDim>;
  using BM = Int<kBlockM>;
  using BN = Int<kBlockN>;
  // Q and dO tiles (query rows x head dim, K-major for S^T / dP^T), kStages deep.
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BM, HD>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<BM, HD, Int<kStages>>{}));
  // ... and as the B operand of dK / dV: (head dim, query rows), head dim contiguous (MN-major).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_ordered_layout(Shape<HD, BM, Int<kStages>>{}, Step<_2, _1, _3>{})));
  // K and V (key rows x head dim), resident; K also as dQ's B operand (head dim, keys).
  using SmemAtomK = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, BN, HD>());
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK{}, Shape<BN, HD>{}));
  using SmemLayoutKt =
      decltype(composition(SmemLayoutK{}, make_ordered_layout(Shape<HD, BN>{}, Step<_2, _1>{})));
  // dS~ as dQ's A operand (query rows x keys), query rows contiguous; double buffered so one
  // barrier per tile separates the writes of tile t+1 from the dQ GEMM reads of tile t.
  using SmemAtomDS = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                              GMMA::Major::MN, Element, BM, BN>());
  // fa3: double buffered; gproj: single (its shared memory is full), one more barrier per tile.
  // (kDqPerWg: single, each warpgroup reading back only its own keys' dS~ after its own wait)
  static constexpr int kDsStages = kGProj || kDqPerWg_ ? 1 : 2;
  using SmemLayoutDS = decltype(tile_to_shape(SmemAtomDS{}, Shape<BM, BN, Int<kDsStages>>{}));
  // ... viewed as (keys, queries) like the S^T accumulator, for the stmatrix stores
  using SmemLayoutDSt = decltype(composition(
      SmemLayoutDS{}, make_ordered_layout(Shape<BN, BM, Int<kDsStages>>{}, Step<_2, _1, _3>{})));

  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, BM, HD>>(),
      Layout<Shape<Int<kMmaWGs>, _1, _1>>{}));  // warpgroups split the keys
  using TiledMmaKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, HD, BM>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<Int<kMmaWGs>, _1, _1>>{}));
  using TiledMmaDQ = std::conditional_t<
      kDqT,
      // kDqT: dQ^T = K^T dS~^T, warpgroups split its M (the head dim)
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float, Shape<_64, BM, BN>, GMMA::Major::MN,
                               GMMA::Major::MN>(),
          Layout<Shape<_2, _1, _1>>{})),
      std::conditional_t<
      kDqPerWg_,
      // kDqPerWg: one warpgroup, its own 64 keys, one half of the head dim at a time (the
      // whole head dim's 64 accumulators at once spilled 280 bytes at d = 64)
      decltype(make_tiled_mma(
          GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, _64>,
                               GMMA::Major::MN, GMMA::Major::MN>(),
          Layout<Shape<_1, _1, _1>>{})),
      std::conditional_t<
          kDqSplitM_,
          decltype(make_tiled_mma(  // kDqSplitM: warpgroups split the query rows
              GMMA::ss_op_selector<Element, Element, float, Shape<_64, HD, BN>, GMMA::Major::MN,
                                   GMMA::Major::MN>(),
              Layout<Shape<_2, _1, _1>>{})),
          decltype(make_tiled_mma(
              GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim / 2>, BN>,
                                   GMMA::Major::MN, GMMA::Major::MN>(),
              Layout<Shape<_1, _2, _1>>{}))>>>;  // warpgroups split the head dim

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  using TmaQ = TmaLoad<Element, decltype(take<0, 2>(SmemLayoutQ{})), Shape<BM, HD>>;
  using TmaK = TmaLoad<Element, SmemLayoutK, Shape<BN, HD>>;

  // gproj variant 4: 224 KB of tiles (K, V, Q, dO, Q' 32 KB each, dS~ and P~ 16 KB, dQ 32 KB) +
  // 2.5 KB of row state: the struct (1024-aligned) is 227 KB, the most a block may have. fa3:
  // 194 KB. gproj: K, V 64 KB + three stages of Q, dO, Q' 144 KB + 5 KB of row state.
  struct NoTiles {};
  struct DqTiles {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> ds;
    // this tile's dQ (fp32, each warpgroup's part in accumulator order: see dq_accum_offset),
    // read by the bulk reduce-add into dq_accum; kDqBuffers of them, by the tile's parity
    cute::array_aligned<float, kDqBuffers * kMmaWGs * kDqWgFloats, 1024> dq;
  };
  struct QcTiles {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> qc;
  };
  struct QcPtTiles {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> qc;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutDS>, 1024> pt;
  };
  using DqStorage = std::conditional_t<kDqHere, DqTiles, NoTiles>;
  using ExtraTiles =
      std::conditional_t<kGProj, std::conditional_t<kDqHere, QcPtTiles, QcTiles>, NoTiles>;
  // Row state per query tile (double buffered): one copy both warpgroups read where they meet
  // every tile anyway (kDqHere), else one per warpgroup, so that neither waits for the other.
  static constexpr int kRowCopies = kWGsMeet ? 1 : kMmaWGs;
  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    DqStorage dq_tiles;  // kDqHere: dS~ (dQ's A operand) and this tile's dQ
    ExtraTiles extra;    // gproj: Q' stages (and, kDqHere, P~ buffers)
    // fa3 {delta, lse2} (rowstate; d = 128: {m, log2 l} from stats and delta); gproj {m, log2 l}
    // (stats) and delta + lambda (rowstate's fourth slot; the two- and three-part variants:
    // {delta, lambda hi} and lambda lo).
    // (16-byte aligned: a lane reads two adjacent queries' state at once)
    // {raw score max, log2 row sum} (stats); not read where lse2 comes from rowstate
    alignas(16) float2 row_st[kRowCopies][2][kLse2InRowstate ? 2 : kBlockM];
    // {delta, lambda hi} (gproj's two- and three-part forms; fa3 mode with lse2 from the stats)
    alignas(16) float2 row_dl[kRowCopies][2][kAFromFp32 || kLse2InRowstate ? 2 : kBlockM];
    // fa3 mode, lse2 from rowstate: delta and lse2 apart
    alignas(16) float row_delta[kRowCopies][2][kLse2InRowstate ? kBlockM : 2];
    alignas(16) float row_lse2[kRowCopies][2][kLse2InRowstate ? kBlockM : 2];
    alignas(16) float row_lo[kRowCopies][2][kGProj && !kAFromFp32 ? kBlockM : 2];  // lambda lo
    // kAFromFp32: delta + lambda (rowstate's fourth slot), the one row value A needs
    alignas(16) float row_dlam[kRowCopies][2][kAFromFp32 ? kBlockM : 2];
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
    alignas(16) typename Pipeline::SharedStorage pipe_q;
    int split_last;  // (kv_head_splits > 1) whether this block stores its key tile's sums
    // kSplitDoPipe: dO's own ring (last, so that the other forms' layout is unchanged)
    alignas(16) std::conditional_t<kSplitDoPipe, typename Pipeline::SharedStorage, NoTiles> pipe_do;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 block may have");
};

template <class Traits>
struct BwdKvParams {
  typename Traits::TmaQ tma_q, tma_do, tma_qc;
  typename Traits::TmaK tma_k, tma_v;
  typename Traits::TmaK tma_kc;  // K' where centered (reads_centered_keys), else = tma_k
  int rows_q, rows_k, batch_q;
  AttnParams p;
};

// dq_accum += the fp32 values at smem (bytes: a multiple of 16), by the bulk copy engine. (An L2
// evict-last policy on it, as FlashAttention-3's reduce-adds carry, measured 0 to +0.7% slower
// for the whole fa3 backward at d = 64 / 128, N = 2k-16k: bench/NOTES.md session 19.)
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, int bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(gmem), "r"(s), "r"(bytes) : "memory");
}


template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    bwd_kv_sm90_kernel(CUTE_GRID_CONSTANT BwdKvParams<Traits> const prm) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Element = typename Traits::Element;
  using T = typename Traits::T;
  constexpr bool kGProj = Traits::kGProj;
  constexpr bool kWaitsForRows = Traits::kWaitsForRows, kCountsDqKeys = Traits::kCountsDqKeys;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  using Pipeline = typename Traits::Pipeline;
  using PipelineState = typename Traits::PipelineState;
  const AttnParams& p = prm.p;

  // (causal: the first key blocks, which the most query tiles see, first; grid_tile)
  // (varlen: a grid of slots, every warp finding its block's tile by slot_tile, from L1)
  const GridTile gt =
      p.slot_rows ? slot_tile(p, reinterpret_cast<const int*>(p.cu_seqlens_k), p.heads_k, false)
                  : grid_tile<Traits::kGroupedGrid>(p, /*longest_last=*/false);
  // (fa3 mode, kv_head_splits > 1: the grid's heads are (kv head, share of its group) pairs)
  const int splits = kGProj ? 1 : p.kv_head_splits;
  const int n_block = gt.tile, hk = splits > 1 ? gt.head / splits : gt.head, b = gt.batch;
  const int group = p.heads / p.heads_k, block_heads = group / splits;
  const SeqBounds seq(p, b);
  const int n0 = n_block * kBlockN;
  if (n0 >= seq.nk) {  // uniform for the block, before any barrier
    if (kWaitsForRows && p.pair_counters) pdl_wait_primary_in_last_block(threadIdx.x == 0);
    return;
  }
  const int n_end = min(n0 + kBlockN, seq.nk);
  const Mask mask(seq.nq, seq.nk, p.window_left, p.window_right, p.diag_shift);
  // fa3 mode: the query tiles in [q_full_lo, q_full_hi) need no mask (Mask::full_query_blocks),
  // two registers tested per tile instead of tile_partial's window bounds, reloaded from the
  // parameters every tile: -2 to -3% at d = 128, causal or not. gproj keeps tile_partial: its
  // KV-outer pass measured ~1% slower with the split (and its d = 64 form spilled 8 more bytes),
  // bench/NOTES.md session 15 item 8.
  int q_full_lo = 0, q_full_hi = 0;
  if constexpr (!kGProj) mask.full_query_blocks(n0, kBlockN, kBlockM, q_full_lo, q_full_hi);
  const int head0 = hk * group + (gt.head - hk * splits) * block_heads;
  // (kRotated, fa3 mode's variant 33: each head's tiles from this block's diagonal tile on)
  constexpr bool kRotated = Traits::kRotated;
  const KeyBlockWork work(mask, n0, n_end, kBlockM, head0, block_heads,
                          !kGProj && p.kv_tiles_outer, kRotated);
  const int tiles_per_head = work.tiles_per_head, n_items = work.n_items;
  const float c = p.softmax_scale * 1.4426950408889634f;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  const int wg = cutlass::canonical_warp_group_idx();
  if (threadIdx.x == 0) {
    // (dK's projection or dQ's rounding may launch once every block has started: they wait for
    // their pairs' keys)
    if ((Traits::kProjectsDk || kCountsDqKeys) && p.pair_counters) pdl_launch_dependents();
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    if constexpr (kGProj) cute::prefetch_tma_descriptor(prm.tma_qc.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    if (p.k_centered) cute::prefetch_tma_descriptor(prm.tma_kc.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename Pipeline::Params pp;
  // Q and dO (and Q') tiles of one stage (kSplitDoPipe: Q alone, dO in pipe_do's stage)
  constexpr int kTileBytes = kBlockM * kHeadDim * int(sizeof(Element));
  pp.transaction_bytes = (kGProj ? 3 : Traits::kSplitDoPipe ? 1 : 2) * kTileBytes;
  pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = Traits::kNumMmaThreads;
  Pipeline pipe_q(ss.pipe_q, pp, Shape<_1, _1, _1>{});
  struct NoRing {};
  using DoRing = std::conditional_t<Traits::kSplitDoPipe, Pipeline, NoRing>;
  DoRing pipe_do = [&]() -> DoRing {
    if constexpr (Traits::kSplitDoPipe) {
      typename Pipeline::Params pd = pp;
      pd.transaction_bytes = kTileBytes;
      return Pipeline(ss.pipe_do, pd, Shape<_1, _1, _1>{});
    } else {
      return NoRing{};
    }
  }();
  __syncthreads();

  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutK{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sDO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Element* qc_ptr = nullptr;  // gproj only (fa3 builds the views but never uses them)
  Element* pt_ptr = nullptr;  // gproj with kDqHere only
  Element* ds_ptr = nullptr;  // kDqHere only
  if constexpr (kGProj) qc_ptr = ss.extra.qc.data();
  if constexpr (kGProj && Traits::kDqHere) pt_ptr = ss.extra.pt.data();
  if constexpr (Traits::kDqHere) ds_ptr = ss.dq_tiles.ds.data();
  Tensor sQc = make_tensor(make_smem_ptr(qc_ptr), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});
  Tensor sQct = make_tensor(make_smem_ptr(qc_ptr), typename Traits::SmemLayoutQt{});
  Tensor sDOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sDS = make_tensor(make_smem_ptr(ds_ptr), typename Traits::SmemLayoutDS{});
  Tensor sPT = make_tensor(make_smem_ptr(pt_ptr), typename Traits::SmemLayoutDS{});
  const int bq = p.cu_seqlens_q ? 0 : b;
  // A programmatic dependent ends after its primary: its last block waits for it, by a thread
  // with nothing else to do (the grid's last block starts when the primary is all but done; warp
  // 1 is the dQ writer where there is one).
  if (kWaitsForRows && p.pair_counters)
    pdl_wait_primary_in_last_block(threadIdx.x == (Traits::kDqHere ? 64 : 32));

  if (wg == 0) {
    // ---------------- producer: K, V once; Q, dO (Q') per query tile ----------------
    // 24 registers, also with the dQ writer: the block is launched with 384 x 168 registers and
    // the consumers' setmaxnreg.inc to 240 only takes what the producer released, 24 + 2 x 240 =
    // 3 x 168 exactly (session 11's writer gave the producer 32: the consumers waited forever).
    cutlass::arch::warpgroup_reg_dealloc<24>();
    if (threadIdx.x == 0 && n_items > 0) {
      if constexpr (Traits::kSplitDoPipe)
        produce_kv_pass_tiles<kGProj, kBlockM, kBlockN, kHeadDim, kRotated>(
            prm, p, seq, b, bq, hk, n_block, work, sK, sV, sQ, sDO, sQc, ss.barrier_kv, pipe_q,
            &pipe_do);
      else
        produce_kv_pass_tiles<kGProj, kBlockM, kBlockN, kHeadDim, kRotated>(
            prm, p, seq, b, bq, hk, n_block, work, sK, sV, sQ, sDO, sQc, ss.barrier_kv, pipe_q);
    }
    if constexpr (Traits::kDqHere) {
      // ---------------- dQ writer (warp 1): dq_accum += each staged dQ tile ----------------
      // Per item: for each consumer warpgroup w in turn, wait until w has staged its half and
      // add it to the tile's slot of dq_accum with one bulk reduce-add per 64-row tile (one bulk
      // group per w; a 128-row tile's second one skipped past the sequence's last tile: its rows
      // are all zero, dS~ being zero there); then, in the same order, wait until the copy engine
      // has read each buffer and free it for w's next tile (not after the last item: no arrive
      // is left pending). Both buffers start free. With two buffers per warpgroup, the reads
      // waited for are the previous item's (its two groups), and that item's buffers are freed
      // for the item after this one; item 0's buffer starts free, item 1's is freed once this
      // warp has taken item 0 (below: why not from the start).
      static_assert(Traits::kMmaWGs == 2, "the dQ writer serves two consumer warpgroups");
      constexpr int kSub = Traits::kDqSubTiles, kHalf = Traits::kDqHalf;
      const bool leader = threadIdx.x == 32;
      if (threadIdx.x / 32 == 1 && n_items > 0) {
        // (pair_counters: dq_accum's zeros, by delta_kernel's generic stores, before the first
        // reduce-add; the consumers' rowstate wait has long passed by the first staged tile. The
        // whole warp waits: the staging barriers below are warp-aligned, and a warp whose leader
        // still spun while its other lanes arrived would be counted there twice: session 22's
        // first form, which hung.)
        if (kWaitsForRows && p.pair_counters) {
          counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) + b * p.heads_k + hk,
                               seq.nq * (p.heads / p.heads_k));
          generic_to_async_proxy_fence();
          __syncwarp();
        }
        constexpr int kBuffers = Traits::kDqBuffers;
        if constexpr (kBuffers == 1) {
          dq_free_arrive(0);
          dq_free_arrive(1);
        }
        ItemCursor cur(work);
        for (int it = 0; it < n_items; ++it, cur = cur.next<kRotated>(work)) {
          const int h = cur.h, mb = cur.mb;
          CUTLASS_PRAGMA_UNROLL
          for (int w = 0; w < 2; ++w) {
            dq_staged_wait(w);
            if (leader) {
              const float* sdq = ss.dq_tiles.dq.data() + Traits::dq_stage(it, w);
              CUTLASS_PRAGMA_UNROLL
              for (int sub = 0; sub < kSub; ++sub) {
                if (Traits::kDqSplitM && sub != w) continue;  // (kDqSplitM: w's own 64 rows)
                const int tile = mb * kSub + sub;
                if (sub > 0 && tile * 64 >= seq.nq) break;
                // (kDqPerWg: w's share of the whole 64-row tile; kDqSplitM: w's 64-row tile;
                // else w's half of the head dim)
                constexpr bool kWholeRows = Traits::kDqPerWg || Traits::kDqSplitM;
                constexpr int kFloats = kWholeRows ? 2 * kHalf : kHalf;
                constexpr int kDqRows = Traits::kDqRows;  // (kDqT: 80-row tiles)
                float* g = reinterpret_cast<float*>(p.dq_accum) +
                           (int64_t(h) * dq_accum_tiles<kDqRows>(p) +
                            dq_tile_base<kDqRows>(p, b, seq.q_start) + tile) *
                               (kDqRows * kHeadDim) + (kWholeRows ? 0 : w * kHalf);
                bulk_reduce_add_f32(g, sdq + (Traits::kDqSplitM ? 0 : sub * kFloats),
                                    kFloats * int(sizeof(float)));
              }
              cute::tma_store_arrive();  // commit w's bulk group
            }
            // Two buffers: item 1's buffer is free from the start, but w may stage item 1 only
            // once this warp has passed w's staging barrier for item 0. Otherwise w's two
            // arrivals can meet in one phase of that barrier (128 + 128 threads of 160, while
            // this warp still sleeps in its pair_counters wait), the phase completes without
            // this warp, and it then waits forever for the 32 it is short: the fa3 d = 128
            // backward hung so, now and then, from session 22 on (its writer's first wait).
            if constexpr (kBuffers == 2) {
              if (it == 0 && n_items > 1) {
                __syncwarp();
                dq_free_arrive(w, 1);
              }
            }
          }
          if constexpr (kBuffers == 1) {
            if (leader) cute::tma_store_wait<1>();  // warpgroup 0's group has read its buffer
            __syncwarp();
            if (it + 1 < n_items) dq_free_arrive(0);
            if (leader) cute::tma_store_wait<0>();  // ... and warpgroup 1's
            __syncwarp();
            if (it + 1 < n_items) dq_free_arrive(1);
          } else if (it >= 1) {
            // the previous item's groups (all but this item's two) have read its buffers, which
            // item it + 1 reuses
            if (leader) cute::tma_store_wait<2>();
            __syncwarp();
            if (it + 1 < n_items) {
              dq_free_arrive(0, (it - 1) & 1);
              dq_free_arrive(1, (it - 1) & 1);
            }
          }
        }
        // (two buffers: the last item's reads, before the block's shared memory goes away)
        if (kBuffers == 2 && leader) cute::tma_store_wait<0>();
      }
      // pair_counters: this block's keys have added all their dQ (also a block without items),
      // counted for dq_finish_kernel once the reduce-adds have landed (waiting for them measured
      // cheaper than dq_finish after the pass: bench/NOTES.md session 22)
      if (kCountsDqKeys && p.pair_counters && leader) {
        bulk_writes_complete();
        counter_add_release(reinterpret_cast<int*>(p.pair_counters) +
                                (p.batch + b) * p.heads_k + hk,
                            n_end - n0);
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegs>();
  const int tid = threadIdx.x - 128;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmaKV mma_kv;
  typename Traits::TiledMmaDQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_kv = mma_kv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(Traits::kDqPerWg ? tid % 128 : tid);
  // shared-memory operands: the warpgroup's slice (warpgroup_slice says why)
  auto wg_sdp = warpgroup_slice(mma_sdp, wg - 1);
  auto wg_kv = warpgroup_slice(mma_kv, wg - 1);
  auto wg_dq = warpgroup_slice(mma_dq, Traits::kDqPerWg ? 0 : wg - 1);
  Tensor tSrK = wg_sdp.partition_fragment_A(sK);
  Tensor tSrV = wg_sdp.partition_fragment_A(sV);
  Tensor tSrQ = wg_sdp.partition_fragment_B(sQ);
  Tensor tSrDO = wg_sdp.partition_fragment_B(sDO);
  Tensor tKVrQt = wg_kv.partition_fragment_B(sQt);
  Tensor tKVrQct = wg_kv.partition_fragment_B(sQct);
  Tensor tKVrDOt = wg_kv.partition_fragment_B(sDOt);
  // (kDqPerWg: dQ's operands restricted to this warpgroup's 64 keys, K^T by head-dim half:
  // tDQrKt the first, tDQrKt1 the second; else tDQrKt1 is not used)
  auto dq_a = [&](auto const& t) {
    if constexpr (Traits::kDqPerWg)
      return local_tile(t, Shape<Int<kBlockM>, _64, Int<Traits::kDsStages>>{},
                        make_coord(_0{}, wg - 1, _0{}));
    else
      return t;
  };
  auto dq_b = [&](int half) {
    if constexpr (Traits::kDqPerWg)
      return local_tile(sKt, Shape<Int<kHeadDim / 2>, _64>{}, make_coord(half, wg - 1));
    else
      return sKt;
  };
  // (kDqT, 80-row tiles: dQ^T = K^T dS~^T, K^T the A operand and dS~ the B; tDQrPT and
  // tDQrKt1 are not used there)
  constexpr bool kDqT = Traits::kDqT;
  Tensor tDQrDS = [&] {
    if constexpr (kDqT) return wg_dq.partition_fragment_B(sDS);
    else return wg_dq.partition_fragment_A(dq_a(sDS));
  }();
  Tensor tDQrKt = [&] {
    if constexpr (kDqT) return wg_dq.partition_fragment_A(sKt);
    else return wg_dq.partition_fragment_B(dq_b(0));
  }();
  Tensor tDQrPT = [&] {
    if constexpr (kDqT) return tDQrDS;
    else return wg_dq.partition_fragment_A(sPT);
  }();
  Tensor tDQrKt1 = [&] {
    if constexpr (kDqT) return tDQrKt;
    else return wg_dq.partition_fragment_B(dq_b(1));
  }();
  // dS~ (and P~) registers -> shared memory with stmatrix. The accumulator's rows are keys and its
  // column pairs adjacent queries; dQ's A operand wants the queries contiguous, so 8 queries of one
  // key are one 16-byte row of a non-transposed 8x8 stmatrix block: 4 instructions per thread
  // instead of 16 scalar stores with their swizzled addresses.
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_sdp);
  auto r2s_thr = r2s.get_thread_slice(tid);
  Tensor tRSsDS = r2s_thr.partition_D(make_tensor(make_smem_ptr(ds_ptr), typename Traits::SmemLayoutDSt{}));
  Tensor tRSsPT = r2s_thr.partition_D(make_tensor(make_smem_ptr(pt_ptr), typename Traits::SmemLayoutDSt{}));
  // fa3 mode's 64-row pass (d = 128): the dS~ stores by a 32-bit shared address taken once.
  // Through cute's copy, with the stage a run-time index, every tile recomputed the four swizzled
  // stmatrix addresses with 64-bit generic arithmetic: ~35 instructions a tile (SASS, session
  // 37; FlashAttention-3's take one base register). The lane's four row addresses are its first
  // one XOR 32 k bytes (k = 0..3: the swizzle moves a 16-byte row within its 128-byte line), and
  // stage s is at + s * kDsStageBytes, which moves no bit the swizzle reads (bits 4-9 of a
  // 1024-aligned buffer); tests/host/ds_store_addresses.cu checks both against CuTe's partition
  // for every lane. The 128-row pass (d = 64) recomputes its eight the same way (~45
  // instructions a tile and a reloaded spill, SASS of session 38's build); with kFa3Ab bit 32
  // (its default since session 39: -3 to -5%, the spill gone) it takes them alike: blocks 4..7 are blocks 0..3 of the next
  // 64 queries, the next swizzle atom, 1024 bytes on (added, not XORed: the buffer is only
  // 1024-aligned, so bit 10 of the address may be set; session 39's first form XORed it and the
  // GPU test caught dQ reading unwritten rows. The host test now places the buffer so.)
  // The 80-row pass (kDqT; dS~ in a 32-byte-swizzled MN-major layout) takes them alike by a
  // simpler rule: block k (16 queries) at the lane's first address + 256 k, no XOR (CuTe's
  // partition says so for every lane: tests/host/ds_store_addresses.cu); through CuTe's copy its
  // address arithmetic left too few registers, and ptxas serialized every WGMMA (C7512).
  constexpr bool kDsByAddress = Traits::kDqHere && !kGProj && !Traits::kDqPerWg &&
                                (kBlockM == 64 || kDqT || (Traits::kFa3Ab & 32));
  constexpr int kDsStageBytes = kBlockM * kBlockN * int(sizeof(Element));
  static_assert(kDsStageBytes % 1024 == 0, "a dS~ stage moves no swizzled address bit");
  constexpr int kDsBlocks = kBlockM / 16;  // x4 stmatrix blocks (8 values each) per lane
  uint32_t ds_addr0 = 0;
  if constexpr (kDsByAddress) {
    static_assert(decltype(size(tRSsDS(_, _, _, 0)))::value == 8 * kDsBlocks &&
                      decltype(size<1>(tRSsDS) * size<2>(tRSsDS))::value == 1,
                  "4, 5 or 8 x4 stmatrix blocks per lane (the layouts the rules were checked on)");
    ds_addr0 = static_cast<uint32_t>(__cvta_generic_to_shared(&tRSsDS(0, 0, 0, 0)));
  }

  auto shape_s = Shape<Int<kBlockN>, Int<kBlockM>>{};  // (keys, queries)
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(shape_s));
  Tensor c_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  constexpr int kRows = decltype(size<0>(c_rc))::value;  // the lane's 2 key rows
  Tensor tdKrdK = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  Tensor tdVrdV = partition_fragment_C(mma_kv, Shape<Int<kBlockN>, Int<kHeadDim>>{});
  clear(tdKrdK);
  clear(tdVrdV);
  Tensor tdKcdK = thr_kv.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // (gproj's λ rows of dQ; kDqT: transposed, unused)
  Tensor tdQcdQ = thr_dq.partition_C(make_identity_tensor(
      std::conditional_t<kDqT, Shape<Int<kHeadDim>, Int<kBlockM>>, Shape<Int<kBlockM>, Int<kHeadDim>>>{}));
  // gproj: per key row, Σ over the head's queries of A, across tiles as an fp32 pair (~48 bits,
  // PairSum: it is multiplied by the large query mean c_q in the rank-one update); inside a tile
  // the lane's 16 terms are summed in fp32 first (error ~16 ulp of one term, far below the dK
  // GEMM's own fp32 accumulation), so the pair costs one TwoSum per row and tile.
  PairSum colsum[kRows];

  // Softmax state, delta (and lambda) of item `it`'s query rows into ss.row_st / dl / lo[it & 1] by
  // cp.async, issued a tile ahead and waited for just before the barrier that publishes them
  // (consumers_sync where the warpgroups meet every tile, else the warpgroup's own), so the load
  // latency hides behind the tile's work and holds no registers. The first warp of each consumer
  // warpgroup takes half of the rows of the shared copy (32 of 64, or 2 x 32 of 128), or all
  // kBlockM of its own. Rows past the end are zero-filled (finite); the mask pass zeroes their P.
  const int w = wg - 1;  // this consumer warpgroup
  constexpr int kRowsPerLane = Traits::kRowCopies == 1 ? kBlockM / 64 : kBlockM / 32;
  const int row_copy = Traits::kRowCopies == 1 ? 0 : w;
  const bool row_lane = (tid & 127) < 32;
  // kRowsAllWarps: this thread's row (slot) and value (field: 0 delta, 1 lse2) of every tile,
  // its rowstate address at the sequence's first row of batch b and the head stride formed once
  // (the empty asm keeps ptxas from re-deriving them from the parameters per tile), and its
  // shared slot in buffer 0.
  constexpr int kRowCopiesAll = 2 * kBlockM;  // delta and lse2 of each row
  constexpr int kRowStep = Traits::kNumMmaThreads / kRowCopiesAll;  // 1 (128 rows) or 2 (64)
  const int row_slot = (tid / kRowStep) % kBlockM, row_field = (tid / kRowStep) / kBlockM;
  const float* rs_mine = reinterpret_cast<const float*>(p.rowstate) +
                         4 * (int64_t(b) * p.rs_batch_stride + seq.q_start) + row_field;
  int64_t rs_head_stride4 = 4 * p.rs_head_stride;
  if constexpr (Traits::kRowsAllWarps) asm volatile("" : "+l"(rs_mine), "+l"(rs_head_stride4));
  auto fetch_rows = [&](int it, int h, int mb) {  // (h, mb: item it's head and query tile)
    if constexpr (Traits::kRowsAllWarps) {
      static_assert(Traits::kLse2InRowstate && Traits::kRowCopies == 1 && kRowStep >= 1 &&
                        Traits::kNumMmaThreads % kRowCopiesAll == 0,
                    "kRowsAllWarps: fa3 mode's one shared copy of {delta, lse2}");
      if (it < n_items && tid % kRowStep == 0) {
        const int i = mb * kBlockM + row_slot;
        const bool ok = i < seq.nq;
        float* dst = row_field == 0 ? &ss.row_delta[0][it & 1][row_slot]
                                    : &ss.row_lse2[0][it & 1][row_slot];
        cp_async_zfill(dst, rs_mine + (ok ? h * rs_head_stride4 + 4 * i : int64_t(0)), ok);
      }
      cute::cp_async_fence();
      return;
    }
    if constexpr (kDqT) {
      // 80-row tiles: the first 160 consumer threads copy one value each (delta or lse2 of one
      // row; warps 0-4, the third warp's lanes split between the two fields), the address formed
      // per tile from the parameters (kRowsAllWarps' addresses held across the loop cost four
      // registers, and this pass has none to spare: S^T, dP^T 40 each, dK, dV 64 each)
      static_assert(Traits::kLse2InRowstate && Traits::kRowCopies == 1, "fa3 mode's {delta, lse2}");
      if (it < n_items && tid < 2 * kBlockM) {
        const int slot = tid % kBlockM, field = tid / kBlockM;
        const int i = mb * kBlockM + slot;
        const bool ok = i < seq.nq;
        const int64_t idx = ok ? rowstat_index(p, b, h, seq.q_start + i) : 0;
        float* dst = field == 0 ? &ss.row_delta[0][it & 1][slot] : &ss.row_lse2[0][it & 1][slot];
        cp_async_zfill(dst, reinterpret_cast<const float*>(p.rowstate) + 4 * idx + field, ok);
      }
      cute::cp_async_fence();
      return;
    }
    if (row_lane && it < n_items) {
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < kRowsPerLane; ++k) {
        const int slot = (tid & 31) + (Traits::kRowCopies == 1 ? 32 * w + 64 * k : 32 * k);
        const int i = mb * kBlockM + slot;
        const bool ok = i < seq.nq;
        const int64_t idx = ok ? rowstat_index(p, b, h, seq.q_start + i) : 0;
        const float* rs = reinterpret_cast<const float*>(p.rowstate) + 4 * idx;
        if constexpr (!Traits::kLse2InRowstate)
          cp_async_zfill(&ss.row_st[row_copy][it & 1][slot], reinterpret_cast<const float2*>(p.stats) + idx, ok);
        if constexpr (Traits::kAFromFp32) {
          cp_async_zfill(&ss.row_dlam[row_copy][it & 1][slot], rs + 3, ok);
        } else if constexpr (Traits::kLse2InRowstate) {
          cp_async_zfill(&ss.row_delta[row_copy][it & 1][slot], rs, ok);
          cp_async_zfill(&ss.row_lse2[row_copy][it & 1][slot], rs + 1, ok);
        } else {
          cp_async_zfill(&ss.row_dl[row_copy][it & 1][slot], reinterpret_cast<const float2*>(rs), ok);
          if constexpr (kGProj) cp_async_zfill(&ss.row_lo[row_copy][it & 1][slot], rs + 2, ok);
        }
      }
    }
    cute::cp_async_fence();
  };
  // The barrier that publishes the fetched rows (and, kDqHere, the dS~ tiles).
  auto rows_sync = [&]() {
    if constexpr (Traits::kWGsMeet) {
      consumers_sync();
    } else {
      wg_sync(w);
    }
  };

  if (n_items > 0) {
    // Launched under the last wave of the pass that writes rowstate (pdl.cuh): the lanes that
    // fetch it first wait until that pass has counted all of this pair's rows (seq.nq for each
    // of the kv head's query heads). The producer's K / V / Q / dO loads read nothing of it and
    // go ahead.
    if constexpr (kWaitsForRows) {
      if (p.pair_counters && (row_lane || Traits::kRowsAllWarps || kDqT))
        counter_wait_acquire(reinterpret_cast<const int*>(p.pair_counters) + b * p.heads_k + hk,
                             seq.nq * (p.heads / p.heads_k));
    }
    // The items' heads and query tiles by a cursor (ItemCursor; in gproj mode head-major,
    // compiled so)
    const int mb_stop = work.mb_min + tiles_per_head;
    ItemCursor cur(work);
    fetch_rows(0, cur.h, cur.mb);
    cute::cp_async_wait<0>();
    rows_sync();
    ss.barrier_kv.wait(0);
    // Without dQ here (gproj) the warpgroups take turns issuing S and dP (the forward's pingpong
    // barriers), so one's elementwise work runs under the other's GEMMs; consumer 0 goes first.
    constexpr int kWGs = Traits::kMmaWGs;
    if constexpr (!Traits::kWGsMeet) {
      if (w == kWGs - 1) turn_pass<kWGs>(w);  // round robin: the last hands consumer 0 the first turn
    }
    PipelineState rd, rd_prev;
    for (int it = 0; it < n_items; ++it) {
      const int h = cur.h, mb = cur.mb;
      const ItemCursor next = cur.next<kRotated>(work);
      const int i0 = mb * kBlockM;
      const float2* row_st = ss.row_st[row_copy][it & 1];
      const float2* row_dl = ss.row_dl[row_copy][it & 1];
      const float* row_lo = ss.row_lo[row_copy][it & 1];
      const float* row_dlam = ss.row_dlam[row_copy][it & 1];
      const float* row_delta = ss.row_delta[row_copy][it & 1];
      const float* row_lse2 = ss.row_lse2[row_copy][it & 1];
      Tensor tSrS = partition_fragment_C(mma_sdp, shape_s);
      Tensor tSrDP = partition_fragment_C(mma_sdp, shape_s);
      pipe_q.consumer_wait(rd);
      if constexpr (!Traits::kWGsMeet) turn_wait(w);
      wg_gemm<true>(mma_sdp, tSrK, tSrQ(_, _, _, rd.index()), tSrS);
      if constexpr (Traits::kSplitDoPipe) pipe_do.consumer_wait(rd);
      wg_gemm<true>(mma_sdp, tSrV, tSrDO(_, _, _, rd.index()), tSrDP);
      if constexpr (!Traits::kWGsMeet) turn_pass<kWGs>(w);
      fetch_rows(it + 1, next.h, next.mb);  // landed before, and published by, this tile's
                                            // consumers_sync below
      // lse2 of the lane's column pair j, j + 1 (adjacent queries): one 8-byte shared load.
      // kLse2Early: this tile's pairs (published by the previous tile's rows_sync) loaded while
      // S and dP run; the wait below is an asm with a memory clobber, so they stay above it
      auto lse2_pair = [&](int j) {
        return *reinterpret_cast<const float2*>(&row_lse2[get<1>(c_rc(0, j))]);
      };
      constexpr int kColPairs = decltype(size<1>(c_rc))::value / 2;
      float2 lse2_early[Traits::kLse2Early ? kColPairs : 1];
      if constexpr (Traits::kLse2Early) {
        CUTLASS_PRAGMA_UNROLL
        for (int jp = 0; jp < kColPairs; ++jp) lse2_early[jp] = lse2_pair(2 * jp);
      }
      // S, dP, and the previous tile's dK: its Q/dO stage is free now (kStageFreedAtEnd: freed
      // at the end of the previous tile). (kPUnderDp: WGMMA groups
      // retire in issue order, so waiting for all but the newest leaves dP on the tensor cores
      // while P is computed.)
      warpgroup_wait<Traits::kPUnderDp ? 1 : 0>();
      if (!Traits::kStageFreedAtEnd && it > 0) pipe_q.consumer_release(rd_prev);

      // P^T from the saved softmax state, fp32 and unrounded (dS needs it), one branch-free pass;
      // entries the mask hides are zeroed in a second pass, only on tiles the mask cuts.
      Tensor s_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor dp_rc = make_tensor(tSrDP.data(), acc_rowcol(tSrDP.layout()));
      // kDqT (80-row tiles): the mask's hidden scores set to -inf before the exp2 pass, which then
      // gives exactly the +0 the pass after it would store (lse2 is finite, or +inf for a row
      // that sees no key: -inf - inf is still -inf). Why here: after the exp2s, the masked
      // branch's merge made ptxas move the eleven P values it could not keep in place through
      // local memory on every tile (STL / LDL pairs; the pass has no register to spare).
      if constexpr (kDqT) {
        if (mb < q_full_lo || mb >= q_full_hi) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(s_rc); ++j)
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r)
              if (!mask.visible(i0 + get<1>(c_rc(r, j)), n0 + get<0>(c_rc(r, j))))
                s_rc(r, j) = -INFINITY;
        }
      }
      // Columns j, j + 1 (j even) are the adjacent queries qi, qi + 1 (a lane's column pair), so
      // their row state is one 16-byte shared load.
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s_rc); j += 2) {
        if constexpr (kGProj) {  // exp2(fma(s - m, c, -log2 l)): the exact-max P
          const float4 st2 = *reinterpret_cast<const float4*>(&row_st[get<1>(c_rc(0, j))]);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            s_rc(r, j) = exp2_approx(fmaf(s_rc(r, j) - st2.x, c, -st2.y));
            s_rc(r, j + 1) = exp2_approx(fmaf(s_rc(r, j + 1) - st2.z, c, -st2.w));
          }
        } else if constexpr (Traits::kLse2InRowstate) {
          // FA3: exp2(fma(s, c, -lse2)), lse2 = m c + log2 l as FA3 stores it, formed once per
          // row by delta_kernel ({delta, lse2} in rowstate)
          const float2 lse2 = Traits::kLse2Early ? lse2_early[j / 2] : lse2_pair(j);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            s_rc(r, j) = exp2_approx(fmaf(s_rc(r, j), c, -lse2.x));
            s_rc(r, j + 1) = exp2_approx(fmaf(s_rc(r, j + 1), c, -lse2.y));
          }
        } else {  // FA3, lse2 formed here from the stats (bit for bit delta_kernel's)
          const float4 st2 = *reinterpret_cast<const float4*>(&row_st[get<1>(c_rc(0, j))]);
          const float lse2_0 = load_row_softmax(make_float2(st2.x, st2.y), c).lse2;
          const float lse2_1 = load_row_softmax(make_float2(st2.z, st2.w), c).lse2;
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            s_rc(r, j) = exp2_approx(fmaf(s_rc(r, j), c, -lse2_0));
            s_rc(r, j + 1) = exp2_approx(fmaf(s_rc(r, j + 1), c, -lse2_1));
          }
        }
      }
      if constexpr (kDqT) {
        // (masked before the exp2s, above)
      } else if constexpr (kGProj || (kBlockM != 128 && !(Traits::kFa3Ab & 4))) {
        // gproj (at its register limit, session 15) and fa3 mode's 64-row d = 128 pass: the
        // per-element test. (The per-row form below measured -1% at d = 128 causal 2k but +0.5
        // to +1.3% elsewhere, without a mask too, where it does not run: the kernel's code
        // around it moved; bench/NOTES.md session 16 item 11. Since session 37's changes that
        // path is 394-423 SASS instructions a masked tile against ~460 unmasked: variant 23, the
        // per-row form at d = 128 again, to be measured.)
        if (kGProj ? mask.tile_partial(i0, i0 + kBlockM, n0, n0 + kBlockN)
                   : (mb < q_full_lo || mb >= q_full_hi)) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < size<1>(s_rc); ++j)
            CUTLASS_PRAGMA_UNROLL
            for (int r = 0; r < kRows; ++r)
              if (!mask.visible(i0 + get<1>(c_rc(r, j)), n0 + get<0>(c_rc(r, j)))) s_rc(r, j) = 0.f;
        }
      } else if (mb < q_full_lo || mb >= q_full_hi) {
        // fa3 mode's 128-row pass (d = 64; variant 23 at d = 128): per key row, its visible
        // queries as one range
        // (Mask::row_queries). A causal mask on a query tile inside the sequence needs the
        // lower bound only: one compare per score instead of visible()'s coordinates and four.
        // Measured -2.4 to -5.2% for the whole fa3 backward at d = 64 causal (bench/NOTES.md
        // session 16 item 11).
        auto queries = [&](int row, int col0, int& lo, int& hi) {
          mask.row_queries(n0 + row, i0 + col0, lo, hi);
        };
        if (mask.left < 0 && i0 + kBlockM <= seq.nq) {
          mask_row_ranges<true, false>(s_rc, c_rc, queries, 0.f);
        } else {
          mask_row_ranges<true, true>(s_rc, c_rc, queries, 0.f);
        }
      }
      // kPUnderDp: dP (after the mask branch: in the P pass's basic block ptxas could hoist this
      // wait above the exp2s, as it did in the forward)
      if constexpr (Traits::kPUnderDp) warpgroup_wait<0>();
      // dS^T = P^T (dP^T - delta) in place; then both rounded once to 16 bits: P~ (dV's A
      // operand) and dS~ (dK's A operand and, through shared memory, dQ's).
      // kAFromFp32 (gproj, one rounded part of A): no dS~ is rounded, so A = dS - lambda P =
      // P (dP - (delta + lambda)) in place instead, with delta + lambda summed once per row by
      // the λ pass (rowstate's fourth slot): one FADD and one FMUL per score, where dS and then
      // A (lambda as hi + lo) took an FADD, an FMUL and two FFMA. Its fp32 rounding differs by
      // ~2^-24 of |P (dP - delta)|; A is rounded to bf16 next, and the fp32 A's row sums are
      // already off zero by what rounding P and dS would have moved them (~2^-9 of a score,
      // kAFromFp32 below), so lambda's low part, 2^-24 of lambda, bought nothing here.
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(dp_rc); j += 2) {
        if constexpr (Traits::kAFromFp32) {
          const float2 dlam = *reinterpret_cast<const float2*>(&row_dlam[get<1>(c_rc(0, j))]);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - dlam.x);
            dp_rc(r, j + 1) = s_rc(r, j + 1) * (dp_rc(r, j + 1) - dlam.y);
          }
        } else if constexpr (Traits::kLse2InRowstate) {
          const float2 dl = *reinterpret_cast<const float2*>(&row_delta[get<1>(c_rc(0, j))]);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - dl.x);
            dp_rc(r, j + 1) = s_rc(r, j + 1) * (dp_rc(r, j + 1) - dl.y);
          }
        } else {
          const float4 dl2 = *reinterpret_cast<const float4*>(&row_dl[get<1>(c_rc(0, j))]);
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            dp_rc(r, j) = s_rc(r, j) * (dp_rc(r, j) - dl2.x);
            dp_rc(r, j + 1) = s_rc(r, j + 1) * (dp_rc(r, j + 1) - dl2.z);
          }
        }
      }
      Tensor tOrP = make_tensor_like<Element>(tSrS);
      Tensor tOrDS = make_tensor_like<Element>(tSrDP);
      round_pairs<T>(tSrS, tOrP);
      // (kAFromFp32 takes dS in fp32 below: no rounded dS~ needed here)
      if constexpr (!Traits::kAFromFp32) round_pairs<T>(tSrDP, tOrDS);
      const int ds_stage = it % Traits::kDsStages;
      if constexpr (kDsByAddress) {
        // (the lane's 32 values in the copy's order: 16 packed pairs, four per stmatrix)
        Tensor src = recast<uint32_t>(r2s_thr.retile_S(tOrDS));
        static_assert(decltype(size(src))::value == 4 * kDsBlocks, "4 packed pairs per block");
        const uint32_t a = ds_addr0 + ds_stage * kDsStageBytes;
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < kDsBlocks; ++k)
          stmatrix_x4(kDqT ? a + uint32_t(256 * k)
                           : (a + uint32_t(1024 * (k / 4))) ^ uint32_t(32 * (k % 4)),
                      src(4 * k), src(4 * k + 1), src(4 * k + 2), src(4 * k + 3));
      } else if constexpr (Traits::kDqHere) {
        copy(r2s, r2s_thr.retile_S(tOrDS), tRSsDS(_, _, _, ds_stage));
      }
      if constexpr (kGProj && Traits::kDqHere) copy(r2s, r2s_thr.retile_S(tOrP), tRSsPT(_, _, _, ds_stage));
      wg_gemm<false>(mma_kv, make_tensor(tOrP.data(), acc_to_a_layout(tSrS.layout())),
                     tKVrDOt(_, _, _, rd.index()), tdVrdV);  // dV += P~^T dO

      float lam_dq[2] = {0.f, 0.f};  // gproj: lambda_hi of this lane's two dQ rows
      if constexpr (kGProj) {
        // A = dS~ - lambda P~ in fp32 from the rounded values the GEMMs see (every row sums to
        // zero to fp32 rounding), as kAParts rounded parts: hi (then projected), hi + lo ("2a"),
        // or hi + mid + lo (~24 bits: bwd_dkdv_kernel.cuh says why three there).
        Tensor p_rc = make_tensor(tOrP.data(), acc_rowcol(tSrS.layout()));
        Tensor ds_rc = make_tensor(tOrDS.data(), acc_rowcol(tSrDP.layout()));
        Tensor tAhi = make_tensor_like<Element>(tSrS);
        Tensor tAmid = make_tensor_like<Element>(tSrS);  // (unused below 3 parts: no registers)
        Tensor tAlo = make_tensor_like<Element>(tSrS);   // (unused with 1 part)
        Tensor hi_rc = make_tensor(tAhi.data(), acc_rowcol(tSrS.layout()));
        Tensor mid_rc = make_tensor(tAmid.data(), acc_rowcol(tSrS.layout()));
        Tensor lo_rc = make_tensor(tAlo.data(), acc_rowcol(tSrS.layout()));
        float tile_sum[kRows];
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) tile_sum[r] = 0.f;
        // A lane's column pair at a time: the row state of queries qi, qi + 1 in two shared
        // loads, and each part rounded as a pair (one conversion for two values).
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < size<1>(p_rc); j += 2) {
          const int qi = get<1>(c_rc(0, j));
          float4 dl2 = make_float4(0.f, 0.f, 0.f, 0.f);
          float2 lo2 = make_float2(0.f, 0.f);
          if constexpr (!Traits::kAFromFp32) {
            dl2 = *reinterpret_cast<const float4*>(&row_dl[qi]);
            lo2 = *reinterpret_cast<const float2*>(&row_lo[qi]);
          }
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            // kAFromFp32: from the fp32 P and dS, formed above (what one rounding of A then
            // loses is of the same size as what rounding them first would; emulator: the same
            // dK errors, NOTES.md session 7). Two or three parts: from the rounded values, whose
            // row sums the parts must keep exact (lambda as hi + lo).
            float a0, a1;
            if constexpr (Traits::kAFromFp32) {
              a0 = dp_rc(r, j);
              a1 = dp_rc(r, j + 1);
            } else {
              const float2 pt = unpack2<T>(reg_pair(p_rc, r, j));
              const float2 ds = unpack2<T>(reg_pair(ds_rc, r, j));
              a0 = fmaf(-lo2.x, pt.x, fmaf(-dl2.y, pt.x, ds.x));
              a1 = fmaf(-lo2.y, pt.y, fmaf(-dl2.w, pt.y, ds.y));
            }
            const uint32_t hi = pack2<T>(a0, a1);
            reg_pair(hi_rc, r, j) = hi;
            if constexpr (Traits::kAParts == 2) {
              const float2 hf = unpack2<T>(hi);
              reg_pair(lo_rc, r, j) = pack2<T>(a0 - hf.x, a1 - hf.y);
            } else if constexpr (Traits::kAParts == 3) {
              const float2 hf = unpack2<T>(hi);
              const float r0 = a0 - hf.x, r1 = a1 - hf.y;
              const uint32_t mid = pack2<T>(r0, r1);
              const float2 mf = unpack2<T>(mid);
              reg_pair(mid_rc, r, j) = mid;
              reg_pair(lo_rc, r, j) = pack2<T>(r0 - mf.x, r1 - mf.y);
            }
            tile_sum[r] += a0;
            tile_sum[r] += a1;
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRows; ++r) colsum[r].add(tile_sum[r]);
        wg_gemm<false>(mma_kv, make_tensor(tAhi.data(), acc_to_a_layout(tSrS.layout())),
                       tKVrQct(_, _, _, rd.index()), tdKrdK);
        if constexpr (Traits::kAParts == 3)
          wg_gemm<false>(mma_kv, make_tensor(tAmid.data(), acc_to_a_layout(tSrS.layout())),
                         tKVrQct(_, _, _, rd.index()), tdKrdK);
        if constexpr (Traits::kAParts >= 2)
          wg_gemm<false>(mma_kv, make_tensor(tAlo.data(), acc_to_a_layout(tSrS.layout())),
                         tKVrQct(_, _, _, rd.index()), tdKrdK);
        if constexpr (Traits::kDqHere) {
          // read before the barrier: after it, a faster warpgroup may refill row_dl[it & 1]
          lam_dq[0] = row_dl[get<0>(tdQcdQ(0))].y;
          lam_dq[1] = row_dl[get<0>(tdQcdQ(2))].y;
        }
        // the A parts' registers must be free before dQ's two accumulators exist, or (no dQ
        // here) before the next tile's S and dP accumulators (240 registers; without this wait
        // ptxas serializes every WGMMA of the loop, C7511)
        warpgroup_wait<0>();
      }

      cute::cp_async_wait<0>();  // the next tile's rows have landed
      if constexpr (!Traits::kDqHere) {
        rows_sync();  // publishes them (this warpgroup's copy)
      } else {
        cutlass::arch::fence_view_async_shared();  // stmatrix writes -> WGMMA reads
        // (kDqPerWg: this warpgroup's own dS~ and rows; else both warpgroups' dS~ halves)
        rows_sync();
        // (the warpgroups' halves of the head dim; kDqPerWg: one half of this warpgroup's)
        constexpr int kDqCols = Traits::kDqPerWg ? kHeadDim / 2 : kHeadDim;
        // (kDqT: dQ^T, head dim x queries)
        using DqShape = std::conditional_t<kDqT, Shape<Int<kHeadDim>, Int<kBlockM>>,
                                           Shape<Int<kBlockM>, Int<kDqCols>>>;
        Tensor tdQrdQ = partition_fragment_C(mma_dq, DqShape{});
        Tensor tdQrPK = partition_fragment_C(mma_dq, DqShape{});  // gproj
        if constexpr (kDqT)
          wg_gemm<true>(mma_dq, tDQrKt, tDQrDS(_, _, _, ds_stage), tdQrdQ);
        else
          wg_gemm<true>(mma_dq, tDQrDS(_, _, _, ds_stage), tDQrKt, tdQrdQ);  // (kDqPerWg: half 0)
        if constexpr (kGProj) {
          wg_gemm<true>(mma_dq, tDQrPT(_, _, _, ds_stage), tDQrKt, tdQrPK);
          warpgroup_wait<0>();
          consumers_sync();  // both warpgroups' dQ GEMMs have read the single dS~ / P~ buffer
        } else {
          // dK += dS~^T Q after dQ, so that the dQ atomics below run while dK is on the tensor
          // cores (wait for dV and dQ only; dK is waited for with the next tile's S and dP)
          wg_gemm<false>(mma_kv, make_tensor(tOrDS.data(), acc_to_a_layout(tSrDP.layout())),
                         tKVrQt(_, _, _, rd.index()), tdKrdK);
          warpgroup_wait<1>();
          if constexpr (Traits::kSplitDoPipe) pipe_do.consumer_release(rd);  // dV done: dO free
        }

        // dq_accum += dS~ K (gproj: dS~ K - lambda_hi P~ K, this key tile's share; unscaled).
        // Each warpgroup writes its 64 x 64 half to shared memory in accumulator order (float4
        // per lane, consecutive lanes consecutive 16 bytes: no bank conflicts), and one lane adds
        // it to the tile's slot of dq_accum with one bulk reduce-add (the copy engine does the
        // 16 KB of fp32 adds in L2, asynchronously; per-element atomics stalled the warps,
        // NOTES.md). A 128-row tile is two 64-row tiles of dq_accum: its accumulator holds the
        // first 64 rows' values, then the next 64's (the MMA_M mode follows the value mode), each
        // staged and added like a 64-row tile's.
        const int lane128 = tid & 127;
        constexpr int kSub = Traits::kDqSubTiles;
        constexpr int kSubVals = decltype(size(tdQrdQ))::value / kSub;  // values per 64-row tile
        constexpr int kHalf = Traits::kDqHalf;  // one warpgroup's half of a 64-row tile
        constexpr int kBuffers = Traits::kDqBuffers;
        float* sdq = ss.dq_tiles.dq.data() + Traits::dq_stage(it, w);
        // the writer's reduce-add of the tile that last used sdq (the previous one, or with two
        // buffers the one before it) has read it
        if (kBuffers == 1) {
          dq_free_wait(w);
        } else if (it >= 1) {  // (item 1: freed once the writer has taken item 0, see there)
          dq_free_wait(w, it & 1);
        }
        // (kDqPerWg: the warpgroup's whole 64-row tiles, half `half` of the head dim of each;
        // dq_accum's layout: half 0's 64 x d/2 in accumulator order, then half 1's)
        auto stage = [&](int half) {
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < size(tdQrdQ); i += 4) {
            float4 x = make_float4(tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3));
            if constexpr (kGProj) {  // values i, i+1 are row r0, values i+2, i+3 row r0 + 8
              x = make_float4(__fsub_rn(x.x, __fmul_rn(lam_dq[0], tdQrPK(i))),
                              __fsub_rn(x.y, __fmul_rn(lam_dq[0], tdQrPK(i + 1))),
                              __fsub_rn(x.z, __fmul_rn(lam_dq[1], tdQrPK(i + 2))),
                              __fsub_rn(x.w, __fmul_rn(lam_dq[1], tdQrPK(i + 3))));
            }
            if constexpr (Traits::kDqSplitM) {
              // (the warpgroup's own 64-row tile: values [0, n / 2) are the m64n(d/2) accumulator
              // of the first head-dim half, in the same order, the rest the second's)
              constexpr int kHalfVals = decltype(size(tdQrdQ))::value / 2;
              *reinterpret_cast<float4*>(sdq + dq_accum_offset(i / kHalfVals, kHeadDim,
                                                               i % kHalfVals, lane128)) = x;
            } else {
              *reinterpret_cast<float4*>(sdq + (i / kSubVals) * (Traits::kDqPerWg ? 2 * kHalf : kHalf) +
                                         dq_accum_offset(half, kHeadDim, i % kSubVals, lane128)) = x;
            }
          }
        };
        stage(0);
        if constexpr (Traits::kDqPerWg) {  // the second half of the head dim, in the same registers
          wg_gemm<true>(mma_dq, tDQrDS(_, _, _, ds_stage), tDQrKt1, tdQrdQ);
          warpgroup_wait<0>();  // (and dK)
          stage(1);
        }
        cutlass::arch::fence_view_async_shared();  // generic writes -> the copy engine's reads
        dq_staged_arrive(w);  // the writer warp adds it to dq_accum
        // 128-row tiles: dK waited for here (it ran under the dQ staging), so that dS~'s 32
        // registers are free before the next tile's S and dP (64 + 64): 52 bytes of spill
        // instead of 64.
        // (80-row tiles likewise: dS~'s 20 registers, an operand of the dK GEMM until it ends,
        // held under the next tile's S^T and dP^T (40 + 40) beside dK and dV made ptxas
        // serialize every WGMMA of the pass, C7512)
        if constexpr (kBlockM == 128 || kDqT || Traits::kStageFreedAtEnd) warpgroup_wait<0>();
        if constexpr (Traits::kStageFreedAtEnd) pipe_q.consumer_release(rd);  // dK done: free
      }
      rd_prev = rd;
      ++rd;
      cur = next;

      if constexpr (kGProj) {
        if (mb == mb_stop - 1) {  // the head's last tile: rank-one
          const T* cq = reinterpret_cast<const T*>(p.q_shift) + (int64_t(b) * p.heads + h) * kHeadDim;
          Tensor dk_rc = make_tensor(tdKrdK.data(), acc_rowcol(tdKrdK.layout()));
          Tensor dkc_rc = make_tensor(tdKcdK.data(), acc_rowcol(tdKcdK.layout()));
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < kRows; ++r) {
            const double cs = quad_sum(colsum[r].value());
            colsum[r] = PairSum{};
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < size<1>(dk_rc); ++j)
              dk_rc(r, j) += float(cs * double(to_float(cq[get<1>(dkc_rc(r, j))])));
          }
        }
      }
    }
    warpgroup_wait<0>();  // the last dK
    if constexpr (!Traits::kWGsMeet) {
      if (w == 0) turn_wait(w);  // the last consumer's last pass
    }
  }

  // (kProjectsDk) This warpgroup's key sums, after its fp32 dK is stored:
  auto store_dk_keysums = [&]() {
    if constexpr (Traits::kProjectsDk) {
      // This warpgroup's Σ_j dK_j (per column) and Σ_j ||dK_j|| over its 64 keys, in fp64 and a
      // fixed order (a lane's two keys, the eight lanes that share its columns, the four warps in
      // order), from exactly the fp32 values dK leaves as, into p.dk_keysum's slot of these 64
      // keys (kKeysumSlot: one warpgroup's keys).
      Tensor dk_rc = make_tensor(tdKrdK.data(), acc_rowcol(tdKrdK.layout()));
      Tensor dkc_rc = make_tensor(tdKcdK.data(), acc_rowcol(tdKcdK.layout()));
      constexpr int kCols = decltype(size<1>(dk_rc))::value;
      double colsum_dk[kCols];
      float row_sq[kRows];
      dk_key_partials(dk_rc, dkc_rc, n0, n_end, p.softmax_scale, colsum_dk, row_sq);
      double norms = 0.0;
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kRows; ++r)
        if ((tid & 3) == 0) norms += double(sqrtf(row_sq[r]));  // the row's norm, once per quad
      CUTLASS_PRAGMA_UNROLL
      for (int m = 1; m < 32; m <<= 1) norms += __shfl_xor_sync(0xffffffffu, norms, m);
      // Staged in this warpgroup's part of the Q ring (its last GEMM has been waited on; the
      // producer is done), then summed by the warpgroup's first kHeadDim + 1 threads.
      constexpr int kRow = kHeadDim + 1;
      static_assert(Traits::kMmaWGs * 4 * kRow * sizeof(double) <= sizeof(ss.q),
                    "key sums fit in the Q ring");
      double* part = reinterpret_cast<double*>(ss.q.data()) + w * 4 * kRow;
      const int wtid = tid & 127, warp = wtid / 32, lane = tid & 31;
      __syncwarp();
      wg_sync(w);  // every warp of the warpgroup is past its last read of the Q ring
      if (lane < 4) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kCols; ++j) part[warp * kRow + get<1>(dkc_rc(0, j))] = colsum_dk[j];
        if (lane == 0) part[warp * kRow + kHeadDim] = norms;
      }
      __syncwarp();
      wg_sync(w);
      static_assert(kKeysumSlot == 64, "one slot per consumer warpgroup's 64 keys");
      const int key0 = n0 + kKeysumSlot * w;  // slots past the sequence stay unwritten
      if (key0 < n_end) {
        double* out = reinterpret_cast<double*>(p.dk_keysum) +
                      ((int64_t(b) * p.heads_k + hk) * dk_keysum_slots(p) + key0 / kKeysumSlot) *
                          kRow;
        for (int t = wtid; t < kRow; t += 128) {
          double acc = 0.0;
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < 4; ++k) acc += part[k * kRow + t];
          out[t] = acc;
        }
      }
    }
  };

  // ---------------- epilogue: dK = alpha dK, dV, rows past the end dropped ----------------
  // (one part of A in dK, kProjectsDk: dK leaves in fp32 only, then its key sums;
  // dk_project.cuh projects it and rounds it once)
  // (store_dk_dv_epilogue: 16-bit dK and dV through the K and V tiles' shared memory)
  if constexpr (Traits::kDqHere && !kGProj) {
    // (kv_head_splits > 1: this block's dK, dV are partial sums over its share of the group; the
    // key tile's last block to add them stores the totals, sum_split_partials)
    if (splits > 1) {
      static_assert(kBlockN == dkv_tile_keys(kHeadDim, false) && Traits::kNumMmaThreads == 256,
                    "dkv_accum's tiles are the 128-key blocks of two consumer warpgroups");
      if (!sum_split_partials<kHeadDim, false>(p, b, hk, n_block, seq.nq, n_items > 0, tid, tdKrdK,
                                        tdVrdV, &ss.split_last, [] { consumers_sync(); }))
        return;
    }
    // fa3 mode: once both warpgroups are past their last GEMM (the dQ GEMMs read every key of K)
    // (kDqPerWg: only this warpgroup's GEMMs read its own K and V rows)
    store_dk_dv_epilogue<T, kHeadDim, false>(p, seq, b, hk, n0, n_end, 64 * w, 0, w, tid,
                                             [w] {
                                               if constexpr (Traits::kDqPerWg) wg_sync(w);
                                               else consumers_sync();
                                             },
                                             mma_kv, tdKrdK, tdVrdV, tdKcdK, sK, sV);
  } else if constexpr (Traits::kProjectsDk) {
    // gproj (A in one part): dV staged in this warpgroup's own V rows, which only its own dP
    // GEMMs read (no dQ GEMM here), once every warp of the warpgroup is past its last GEMM
    store_dk_dv_epilogue<T, kHeadDim, true>(p, seq, b, hk, n0, n_end, 64 * w, 0, w, tid,
                                            [w] { wg_sync(w); }, mma_kv, tdKrdK, tdVrdV, tdKcdK,
                                            sK, sV);
    store_dk_keysums();
    if (p.pair_counters) {
      // This warpgroup's fp32 dK rows and key sums are written: counted for the key-sum totals
      // and dK's projection, which wait for their pair's keys (pdl.cuh). (By the producer's
      // second warp instead, any code there made ptxas spill in the consumers' loop.)
      wg_sync(w);
      if ((tid & 127) == 0)
        counter_add_release(reinterpret_cast<int*>(p.pair_counters) +
                                (p.batch + b) * p.heads_k + hk,
                            min(max(n_end - n0 - kKeysumSlot * w, 0), kKeysumSlot));
    }
  } else {  // (the A/B variants with A in two or three parts)
    store_dk_dv<T, false>(p, seq, b, hk, n0, n_end, tdKrdK, tdVrdV, tdKcdK);
  }
#endif
}

template <typename T, int kHeadDim, bool kGProj, int kAParts = 3, bool kDqHere = !kGProj,
          int kMmaWGs = 2, int kBlockM = 64, bool kDqPerWg = false, bool kDqSplitM = false,
          int kFa3Ab = 0>
void run_bwd_kv(const AttnParams& p, int total_q, int total_k) {
  using Traits = BwdKvTraits<T, kHeadDim, kGProj, kAParts, kDqHere, kMmaWGs, kBlockM, kDqPerWg,
                             kDqSplitM, kFa3Ab>;
  BwdKvParams<Traits> prm;
  auto tma_q = set_kv_pass_tmas<Traits>(prm, p, total_q, total_k);
  prm.tma_qc = kGProj ? tma_q(p.q_centered, p.qc_stride) : prm.tma_q;
  auto kernel = bwd_kv_sm90_kernel<Traits>;
  const int smem = Traits::kSmemBytes;
  const int tiles = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
  if (tiles == 0) return;
  if constexpr (!kGProj) prm.p.kv_tiles_outer = kv_tiles_outer(p);
  // (fa3 mode, kv_head_splits > 1: a grid head per (kv head, share of its group); run_backward
  // has checked that the shares divide the group and that the call is dense)
  const int splits = kGProj ? 1 : p.kv_head_splits;
  dim3 grid;
  if (!slot_grid(prm.p, Traits::kBlockN, total_k, p.heads_k, grid)) {
    // (fa3 mode, kGroupedGrid from N = 4k: a pair's Q, dO and dq_accum, over the block's query
    // heads)
    const int64_t group_bytes = Traits::kGroupedGrid && p.seqlen_q >= 4096 && bwd_variant() != 19
                                    ? int64_t(p.seqlen_q) * kHeadDim * (2 * int(sizeof(T)) + 4) *
                                          (p.heads / p.heads_k / splits)
                                    : 0;
    grid = tile_grid(prm.p, tiles, p.heads_k * splits, p.batch, group_bytes);
  }
  launch_sm90(kernel, grid, Traits::kNumThreads, smem, prm, p, "KV-outer backward (sm90)",
              /*programmatic=*/Traits::kWaitsForRows && p.pair_counters != 0 &&
                  bwd_variant() != 12);
}

}  // namespace sm90
}  // namespace gproj
