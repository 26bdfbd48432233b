// Tile shapes per head dim, and the templated launchers. Shapes are the small, register-safe
// choices of a correctness-first kernel that must also fit an A100's 163 KB of shared memory.
#pragma once
#include <cuda_runtime.h>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include "../backward/bwd_dkdv_kernel.cuh"
#include "../backward/bwd_kv_sm90.cuh"
#include "../backward/bwd_kv_dkvt_sm90.cuh"
#include "../backward/bwd_kv_split_sm90.cuh"
#include "../backward/bwd_lambda_sm90.cuh"
#include "../backward/bwd_dq_kernel.cuh"
#include "../common/cuda_check.h"
#include "../forward/fwd_kernel.cuh"
#include "../forward/fwd_sm90.cuh"
#include "../prepost/bwd_prepost.cuh"
#include "../prepost/center_keys.cuh"
#include "../prepost/dk_project.cuh"
#include "variants.h"

namespace gproj {

//                               fwd BM, BN | dq BM, BN, DSPLIT | dkdv BN, BM, DSPLIT
template <int D> struct Tiles;
template <> struct Tiles<64>  { static constexpr int f[2] = {128, 64}, q[3] = {64, 64, 1}, kv[3] = {64, 64, 1}; };
template <> struct Tiles<128> { static constexpr int f[2] = {128, 64}, q[3] = {64, 32, 1}, kv[3] = {64, 32, 1}; };
template <> struct Tiles<256> { static constexpr int f[2] = {64, 64},  q[3] = {64, 32, 2}, kv[3] = {32, 32, 2}; };

template <class Kernel>
inline void launch(Kernel kernel, dim3 grid, int threads, int smem, const AttnParams& p,
                   const char* name) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  // Opt in to > 48 KB of dynamic shared memory (cheap; done on every launch so that a kernel
  // first used on a second device is also set up).
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             name);
  kernel<<<grid, threads, smem, reinterpret_cast<cudaStream_t>(p.stream)>>>(p);
  check_cuda(cudaGetLastError(), name);
}

inline unsigned ceil_div(int a, int b) { return unsigned((a + b - 1) / b); }

template <typename T, int D>
void hopper_backward(const AttnParams& p_in) {
  const int variant = bwd_variant();
  const bool gproj = p_in.numerics == int(Numerics::kGProj);
  // Each pass starts under its predecessor's last wave (pdl.cuh), every block waiting only for
  // its (sequence, kv head) pair's counts in pair_counters: the KV-outer pass under the pass that
  // writes rowstate (gproj: the λ + dQ pass, at d = 256 the λ pre-pass; fa3 mode: delta_kernel),
  // dK's key-sum totals and projection under the KV-outer pass, and dQ's rounding (fa3 mode, and
  // gproj at d = 256) after every key's dQ. Variant 11: one after the other; gproj's variant 4
  // at d = 64 / 128 (the λ-only pre-pass, dQ by bulk reduce-adds) counts nothing. Measured:
  // NOTES.md sessions 21 and 22.
  AttnParams p = p_in;
  if (variant == 11 || (gproj && variant == 4 && D != 256)) p.pair_counters = 0;
  if (p.pair_counters)
    check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(p.pair_counters), 0,
                               2 * sizeof(int) * size_t(p.batch) * size_t(p.heads_k),
                               reinterpret_cast<cudaStream_t>(p.stream)),
               "zeroing pair_counters");
  // (fa3 mode's split group, kv_head_splits > 1: delta_kernel zeroes dkv_accum pair by pair)
  if (!gproj) {
    // (variant 39 at d = 128: 80-row query tiles, whose dq_accum tiles are 80 rows: tile.cuh)
    constexpr bool kDq80Possible = D == 128;
    const bool dq80 = kDq80Possible && variant == 39;
    if (dq80) {
      if constexpr (kDq80Possible) launch_delta<T, D, 80>(p);
    } else {
      launch_delta<T, D>(p);
    }
    if constexpr (D == 256) {  // dK, dV rows too wide for one warpgroup
      if (variant == 16) {  // the head dim split between the warpgroups, 64-key blocks (A/B; the
                            // default until session 28)
        sm90::run_bwd_kv_split<T, D, false>(p, p.total_q, p.total_k);
      } else {  // 80-key blocks, dK and dV transposed (FlashAttention-3's partition): 20% fewer
                // dQ reduction bytes per flop; -2 to -9% (bench/NOTES.md session 28)
        sm90::run_bwd_kv_dkvt<T, D>(p, p.total_q, p.total_k);
      }
    } else if constexpr (D == 64) {  // 128 x 128 tiles (FlashAttention-3's at d = 64);
      if (variant == 9) {             // variant 9: 64-row query tiles (the default until session 11)
        sm90::run_bwd_kv<T, D, false>(p, p.total_q, p.total_k);
      } else if (variant == 13) {     // variant 13: per-warpgroup dQ, pingpong (slower: A/B)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, true>(p, p.total_q, p.total_k);
      } else if (variant == 15) {     // variant 15: dQ's GEMM split by head-dim halves (A/B;
                                      // the default until session 26)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128>(p, p.total_q, p.total_k);
      } else if (variant == 24) {     // variant 24: the Q / dO stage freed at the tile's end
                                      // (A/B, session 39: kStageFreedAtEnd)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 8>(p, p.total_q, p.total_k);
      } else if (variant == 25) {     // variant 25: dO in a ring of its own, freed once dV is
                                      // done; Q's stage at the tile's end (A/B, session 39)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 24>(p, p.total_q, p.total_k);
      } else if (variant == 26) {     // variant 26: the dS~ stores by one 32-bit address, as
                                      // the 64-row pass's (A/B, session 39)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 32>(p, p.total_q, p.total_k);
      } else if (variant == 31) {     // variant 31: the default until session 39 (A/B): the
                                      // stage freed after the next tile's S, dS~ through CuTe
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true>(p, p.total_q, p.total_k);
      } else if (variant == 33) {     // variant 33: the default from each block's diagonal tile
                                      // on (A/B, session 41: kFa3Ab bit 64)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 104>(p, p.total_q, p.total_k);
      } else if (variant == 37) {     // variant 37: the default with every consumer warp copying
                                      // a share of the row state (A/B, session 42: bit 128)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 168>(p, p.total_q, p.total_k);
      } else {  // dQ's GEMM split by query rows (kDqSplitM; -3 to -5%, bench/NOTES.md session 26),
                // since session 39 the Q / dO stage freed at the tile's end and the dS~ stores by
                // address (variant 27's form; -3 to -5% against variant 31, session 39)
        sm90::run_bwd_kv<T, D, false, 3, true, 2, 128, false, true, 40>(p, p.total_q, p.total_k);
      }
    } else if (variant == 14) {  // d = 128, variant 14: per-warpgroup dQ, pingpong (A/B)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, true>(p, p.total_q, p.total_k);
    } else if (variant == 18) {  // d = 128, variant 18: dP waited for before P, lse2 formed from
                                 // the stats (A/B; the default until session 37)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 3>(p, p.total_q, p.total_k);
    } else if (variant == 23) {  // d = 128, variant 23: the diagonal tiles masked by key-row
                                 // ranges (A/B, session 38)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 4>(p, p.total_q, p.total_k);
    } else if (variant == 24 || variant == 27) {  // d = 128, variant 24 (27: the same at
                                 // d = 128): the Q / dO stage freed at the tile's end (A/B,
                                 // session 39: kStageFreedAtEnd)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 8>(p, p.total_q, p.total_k);
    } else if (variant == 25) {  // d = 128, variant 25: dO in a ring of its own, freed once dV
                                 // is done; Q's stage at the tile's end (A/B, session 39)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 24>(p, p.total_q, p.total_k);
    } else if (variant == 33) {  // d = 128, variant 33: the default from each block's diagonal
                                 // tile on (A/B, session 41: kFa3Ab bit 64)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 64>(p, p.total_q, p.total_k);
    } else if (variant == 37) {  // d = 128, variant 37: session 37's form with every consumer
                                 // warp copying a share of the row state (A/B, session 42: bit 128)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 128>(p, p.total_q, p.total_k);
    } else if (variant == 38) {  // d = 128, variant 38: the default from session 37 to 41, the
                                 // diagonal tiles masked per element (A/B)
      sm90::run_bwd_kv<T, D, false>(p, p.total_q, p.total_k);
    } else if (variant == 40) {  // d = 128, variant 40: the default with lse2 read before the
                                 // wait for S (A/B, session 45: kFa3Ab bit 256)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 260>(p, p.total_q, p.total_k);
    } else if (variant == 39) {  // d = 128, variant 39: 80 x 128 tiles, dQ transposed
                                 // (FlashAttention-3's tile without a causal mask; A/B, session 44)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 80>(p, p.total_q, p.total_k);
    } else {  // d = 128: since session 42 the diagonal tiles masked by key-row ranges (variant
              // 23's form: -0.7 to -2.7% under a causal mask at 2k-8k, within 0.4% without one;
              // H100, bench/results/session42_2026-12-05)
      sm90::run_bwd_kv<T, D, false, 3, true, 2, 64, false, false, 4>(p, p.total_q, p.total_k);
    }
    if (dq80) {
      if constexpr (kDq80Possible) launch_dq_finish<T, D, 80>(p);
    } else {
      launch_dq_finish<T, D>(p);
    }
    return;
  }
  // (fp16 gproj: the mma.sync passes; launch.cu refuses it here)
  if constexpr (std::is_same<T, bf16>::value && D == 256) {
    // d = 256: the λ pre-pass (delta, lambda), then the head-dim-split KV-outer pass with dQ
    // there (A in two parts for dQ; bwd_kv_split_sm90.cuh), dQ rounded from dq_accum. dK from
    // A's high part, then projected; variants 3, 4 and 6 (hopper_bwd_projects_dk: false): from
    // both parts.
    if (variant == 7) {  // 32-key tiles in two stages (A/B; the default until session 10)
      sm90::run_lambda_prepass<T, D, false, 32, 2>(p, p.total_q, p.total_k);
    } else {
      sm90::run_lambda_prepass<T, D, false>(p, p.total_q, p.total_k);
    }
    if (hopper_bwd_projects_dk(p)) {
      sm90::run_bwd_kv_split<T, D, true, 1>(p, p.total_q, p.total_k);
      launch_dk_project<T, D>(p);
    } else {
      sm90::run_bwd_kv_split<T, D, true, 2>(p, p.total_q, p.total_k);
    }
    launch_dq_finish<T, D>(p);
  } else if constexpr (std::is_same<T, bf16>::value) {
    // The KV-outer pass with A in one part: two consumer warpgroups (A from the fp32 P and dS)
    // at every head dim; at d = 64 they measured 2-4% faster over the whole backward than three
    // (192-key blocks, rounded A: variant 5) at N = 2k-16k, causal or not (NOTES.md session 8).
    // The two- and three-part forms (variants 3 and 6) keep three at d = 64, as measured.
    constexpr int kPartsWGs = D == 64 ? 3 : 2;
    if (variant == 4) {  // the session-4 design: λ only, dQ in the KV-outer pass
      sm90::run_lambda_prepass<T, D, false>(p, p.total_q, p.total_k);
      sm90::run_bwd_kv<T, D, true, 2, true>(p, p.total_q, p.total_k);
      launch_dq_finish<T, D>(p);
      return;
    }
    // delta, lambda, dQ; at d = 64 variants 7 and 8 run 64- and 128-key tiles instead of 96
    if constexpr (D == 64) {
      if (variant == 7) {
        sm90::run_lambda_prepass<T, D, true, 64, 3>(p, p.total_q, p.total_k);
      } else if (variant == 8) {
        sm90::run_lambda_prepass<T, D, true, 128, 2>(p, p.total_q, p.total_k);
      } else {
        sm90::run_lambda_prepass<T, D, true>(p, p.total_q, p.total_k);
      }
    } else {
      sm90::run_lambda_prepass<T, D, true>(p, p.total_q, p.total_k);
    }
    if (variant == 3) {         // A in three rounded parts
      sm90::run_bwd_kv<T, D, true, 3, false, kPartsWGs>(p, p.total_q, p.total_k);
    } else if (variant == 6) {  // A in two rounded parts
      sm90::run_bwd_kv<T, D, true, 2, false, kPartsWGs>(p, p.total_q, p.total_k);
    } else {                    // A in one part, then dK projected
      if constexpr (D == 64) {
        if (variant == 5) {         // three consumer warpgroups, rounded A (the default until
          sm90::run_bwd_kv<T, D, true, 1, false, 3>(p, p.total_q, p.total_k);  // session 8)
        } else if (variant == 9) {  // 64-row query tiles, as at d = 128
          sm90::run_bwd_kv<T, D, true, 1, false, 2>(p, p.total_q, p.total_k);
        } else if (variant == 10) {  // 96-row query tiles (the default until session 11)
          sm90::run_bwd_kv<T, D, true, 1, false, 2, 96>(p, p.total_q, p.total_k);
        } else {  // 128-row query tiles, as fa3 mode's here: the whole backward 1.3-5.6% faster
                  // than with 96 at N = 2k-16k, causal or not (NOTES.md session 11)
          sm90::run_bwd_kv<T, D, true, 1, false, 2, 128>(p, p.total_q, p.total_k);
        }
      } else {
        sm90::run_bwd_kv<T, D, true, 1, false, 2>(p, p.total_q, p.total_k);
      }
      launch_dk_project<T, D>(p);
    }
  }
}

template <typename T, int D, int V>
void forward_sm90(const AttnParams& p) {
  if (p.numerics == int(Numerics::kGProj)) {
    sm90::run_forward<T, D, true, V>(p, p.total_q, p.total_k);
  } else {
    sm90::run_forward<T, D, false, V>(p, p.total_q, p.total_k);
  }
}

template <typename T, int D>
void forward_impl(const AttnParams& p) {
  if (p.arch >= 90 && !force_sm80()) {
#ifndef GPROJ_NO_FWD_VARIANTS
    switch (fwd_variant()) {
      case 1: forward_sm90<T, D, 1>(p); return;
      case 2: forward_sm90<T, D, 2>(p); return;
      case 3: forward_sm90<T, D, 3>(p); return;
      case 4: forward_sm90<T, D, 4>(p); return;
      case 5: forward_sm90<T, D, 5>(p); return;
      case 6: forward_sm90<T, D, 6>(p); return;
      case 7: forward_sm90<T, D, 7>(p); return;
      case 8: forward_sm90<T, D, 0>(p); return;  // variant 0's kernel at every shape
      case 9: forward_sm90<T, D, 9>(p); return;
      case 10: forward_sm90<T, D, 10>(p); return;  // K waited for after the turn (FwdTiles)
      // The P.V wait at the top of the next iteration, the form before session 31, on the kernel
      // the default runs from N = 2k (FwdTiles); bf16 only (else the default).
      case 11:
        if constexpr (std::is_same_v<T, bf16>) { forward_sm90<T, D, 11>(p); return; }
        break;
      // d = 64: the two-warpgroup kernel with P.V waited for after the softmax, the form before
      // session 32 (FwdTiles); d = 256: variant 6's 80-key kernel persistent, O staged in the V
      // stages (FwdTraits::kOThroughV); bf16 only (else the default).
      case 12:
        if constexpr (std::is_same_v<T, bf16> && (D == 64 || D == 256)) {
          forward_sm90<T, D, 12>(p);
          return;
        }
        break;
      default: break;
    }
#endif
    // d = 64: three consumer warpgroups on 192-row query tiles (variant 5, non-persistent) where
    // they measured faster than two on 128-row tiles (persistent): interleaved A/B at 91e0a75
    // (bench/NOTES.md session 9), fa3 / gproj time, 3 against 2 warpgroups: no mask N=1k
    // +6% / +7%, 2k -8% / -5%, 4k -11% / -7%, 8k -15% / -11%, 16k -16% / -12%; causal 1k +27%,
    // 2k +6% / +9%, 4k 0% / +3%, 8k -9% / -4%, 16k -11% / -7%. (Short or masked rows leave more
    // of a 192-row tile idle on its diagonal and in its last rows.)
    // Since session 15 the three warpgroups run persistent (under a mask with the tile counter)
    // with P.V waited for at the top of the next iteration, so that the softmax overlaps it
    // (variant 9), from N = 4k under a mask and 2k without. Persistence alone (variant 4), fa3 /
    // gproj time against the then default (bench/NOTES.md session 15 item 4): causal 2k +1% /
    // +0.5% (so not there), 4k -1.9% / -1.6%, 8k 0% / -4.0%, 16k +2.3% / -2.4%; no mask 2k -4.7%
    // / -8.1%, 16k +2.2% / -3.2%. The overlap on top (item 7), against variant 4: causal 4k -2.0%
    // / +0.4%, 8k -3.0% / -1.0%, 16k -4.9% / -1.9%; no mask 2k -2.2% / -0.2%, 4k -4.2% / -1.5%,
    // 16k -5.9% / -2.4%. (Session 9 measured the overlap 2-7% slower with two warpgroups, with
    // the wait at the top of the next iteration; since session 32 the two-warpgroup kernel below
    // these lengths waits inside the softmax, session 31's form: fa3 mode -2 to -6%, gproj 0 to
    // -1% at N = 1k-2k, and at 2k causal as fast as variant 9, bench/NOTES.md session 32.)
    // Since session 33 a dense batch's query tiles under a causal-like mask end at row N (the
    // partial tile is the first, FwdKernelParams::partial_first), and at N = 2k the three
    // warpgroups' 11 tiles of a (sequence, head) need 96 key tiles instead of 101: variant 9
    // against the two warpgroups, interleaved, fa3 / gproj: causal 2k -9.3% / -7.8%, 1k -4.0% /
    // -2.9% (bench/NOTES.md session 33). So from N = 1k under a mask on dense batches (varlen
    // batches, not measured: from 4k, as before).
    const bool masked = p.masked();
    if constexpr (D == 64) {
      if (p.seqlen_q >= (!masked ? 2048 : p.cu_seqlens_q ? 4096 : 1024)) {
        forward_sm90<T, D, 9>(p);
        return;
      }
    }
    // d = 128: persistent (variant 0), except under a mask beyond N = 8k, where one tile per
    // block (variant 3, pair after pair; since session 31 variant 9, below) measured faster; fa3 / gproj time, persistent against
    // one-tile blocks, interleaved (bench/NOTES.md session 13, items 4 and 7): no mask 1k
    // -4% / -3%, 2k -1% / -2%, 8k 0% / -2%; causal 2k -3.5% / -4.5%, 4k +1% / -1%, 16k +19% /
    // +17%; since the tile decode lost its divisions (session 14, item 10): causal 4k -0.6% /
    // -1.1%, 8k -1.0% / -0.4%, GQA 4k -2.7% / -3.3%, 16k +19% / +18% (GQA +17% / +18%).
    // fa3 mode without a mask from N = 8k: FlashAttention-3's 176-key tiles (variant 9, one-tile
    // blocks), 3-4% faster there (8k -3.1%, 16k -4.0%); slower at 2k-4k (+1-1.5%), with a mask
    // (+0-11%) and in gproj mode (+0.4% at 8k, and -1.2% at 16k only). Both modes since session
    // 35: against the persistent kernel with one (sequence, head) pair at a time (session 34),
    // interleaved, gproj 8k -0.5%, 16k -3.6% (2k +7%, 4k +3.5%; bench/NOTES.md session 35).
    // Varlen took one-tile blocks (variant 3) until session 35: the persistent schedule then had
    // a tile for every query block of the longest sequence in every sequence, most of them empty,
    // and its round robin over them measured 8-20% slower than one-tile blocks
    // (bench/results/speed.json at ef60507 against 3da9c69, mean lengths 1k and 4k; bench/NOTES.md
    // session 13 item 9). Since session 35 it runs over the one-tile grid's slots, from the tile
    // counter (run_forward, decode_slot).
    // d = 256: FlashAttention-3's 80-key tiles (HGMMA 64x80x16 for S, 224 KB of shared memory)
    // and its d = 256 schedule since session 36 (variant 7): persistent, O staged in the V stages
    // so that the next tile's Q loads under this tile's end (FwdTraits::kOThroughV), and no
    // pingpong between the two consumer warpgroups (FlashAttention-3 has no scheduler barrier
    // above d = 128). Interleaved A/B against the session-35 default (bench/NOTES.md session 36),
    // fa3 / gproj time: dense from 2k against variant 6 (one-tile, pingpong) 2k -3.3 / -1.2%,
    // causal -5.0 / -4.3%, 4k -2.0 / -0.4%, causal -3.5 / -1.9%, 8k -2.1 / 0%, causal -1.3 /
    // -0.4%, 16k -0.8 / +0.3%, causal -1.6 / -0.3%; below 2k against the 64-key one-tile kernel
    // 1k -9 / -7%, causal -8 / -8.5%, 512 -6 / -5%, causal -11 / -10%; varlen (bench/speed.py's
    // batches, longest 1565 and 4311) against variant 6: 0 to -3% / 0 to -2%. The same key tiles
    // in the same order as variant 6 (bitwise equal output and LSE, tests/test_gpu.py). Before:
    // variant 6 (one-tile, pingpong) from 2k (session 16: -4 to -10% against 64 keys) and on
    // varlen batches whose longest sequence has 1k rows or more (session 35), 64 keys below.
    if constexpr (D == 256) {
      forward_sm90<T, D, 7>(p);
      return;
    }
    if constexpr (D == 128) {
      // Varlen: persistent over the batch's slots since session 35 (run_forward, decode_slot);
      // one-tile blocks (variant 3) before.
      if (p.cu_seqlens_q != 0) {
        forward_sm90<T, D, 0>(p);
        return;
      }
      // gproj under a causal-like mask (a right bound only) on dense batches: variant 1, the
      // persistent kernel without pingpong. Interleaved against the default (bench/NOTES.md
      // session 36), gproj time: causal 1k -0.6%, 2k -1.2%, 4k -1.6%, 8k -1.7%, 16k (against
      // variant 9) -2.2%, GQA 16k -2.3%; without a mask +0.5 to +1.4% and on varlen batches -0.5
      // to +1% (so not there); fa3 mode 0 to +1.8% (its softmax, one FP32 instruction per score
      // shorter than gproj's, hides under the other warpgroup's GEMMs with pingpong).
      if (p.numerics == int(Numerics::kGProj) && p.window_left < 0 && p.window_right >= 0) {
        forward_sm90<T, D, 1>(p);
        return;
      }
      // Under a mask beyond N = 8k: one-tile blocks, since session 31 on 176-key tiles (variant
      // 9; with the P.V wait inside the softmax it measured 3-5% faster than variant 3's 128 keys
      // at 16k causal in both modes, bench/NOTES.md session 31). Since session 37 not under a
      // causal-like mask (fa3 mode here; gproj took variant 1 above): the persistent kernel
      // (variant 0's, with the schedule of sessions 32-35) measured faster there, interleaved
      // (session 36), 12k -2.2%, 16k -0.7% and -1.0% (two runs), GQA 16k -1.4% and -0.9%.
      if (masked && p.seqlen_q > 8192 && !(p.window_left < 0 && p.window_right >= 0)) {
        forward_sm90<T, D, 9>(p);
        return;
      }
      if (!masked && p.seqlen_q >= 8192) {
        forward_sm90<T, D, 9>(p);
        return;
      }
    }
    forward_sm90<T, D, 0>(p);
    return;
  }
  using Cfg = FwdConfig<T, D, Tiles<D>::f[0], Tiles<D>::f[1]>;
  const dim3 grid(ceil_div(p.seqlen_q, Cfg::BM), p.heads, p.batch);
  if (p.numerics == int(Numerics::kGProj)) {
    launch(fwd_kernel<Cfg, true>, grid, Cfg::kThreads, Cfg::kSmemBytes, p, "forward");
  } else {
    launch(fwd_kernel<Cfg, false>, grid, Cfg::kThreads, Cfg::kSmemBytes, p, "forward");
  }
}

template <typename T, int D, bool kGProj>
void backward_mode(const AttnParams& p) {
  constexpr auto q = Tiles<D>::q;
  constexpr auto kv = Tiles<D>::kv;
  using DqCfg = BwdDqConfig<T, D, q[0], q[1], q[2]>;
  using KvCfg = BwdDkdvConfig<T, D, kv[0], kv[1], kv[2], kGProj>;
  constexpr bool kConvert = !std::is_same<T, typename GradGemmType<T, kGProj>::type>::value;
  if (p.backward_passes & 1)
    launch(bwd_dq_kernel<DqCfg, kGProj>, dim3(ceil_div(p.seqlen_q, DqCfg::BM), p.heads, p.batch),
           DqCfg::kThreads, DqCfg::template smem_bytes<kConvert>(), p, "backward dq pass");
  if (p.backward_passes & 2)
    launch(bwd_dkdv_kernel<KvCfg, kGProj>,
           dim3(ceil_div(p.seqlen_k, KvCfg::BN), p.heads_k, p.batch), KvCfg::kThreads,
           KvCfg::kSmemBytes, p, "backward dk/dv pass");
}

template <typename T, int D>
void backward_impl(const AttnParams& p) {
  if (p.backward_passes == 4) {  // the Hopper λ pre-pass alone (validated by run_backward)
    sm90::run_lambda_prepass<T, D>(p, p.total_q, p.total_k);
    return;
  }
  if (p.backward_passes == 8) {  // the Hopper backward (run_backward validates)
    hopper_backward<T, D>(p);
    return;
  }
  if (p.numerics == int(Numerics::kGProj)) {
    backward_mode<T, D, true>(p);
  } else {
    backward_mode<T, D, false>(p);
  }
}

}  // namespace gproj
