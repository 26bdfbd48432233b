// Host-side check of fa3 mode's dS~ stores in the KV-outer pass (csrc/backward/bwd_kv_sm90.cuh,
// kDsByAddress), built and run by tests/test_host_layout.py with nvcc, no GPU needed. The kernel
// stores a lane's dS~ values with x4 stmatrix at the 32-bit addresses
//   (base + stage * kDsStageBytes + 1024 (k div 4)) ^ 32 (k mod 4),  k = 0 .. blocks - 1,
// base the shared address CuTe's partition gives the lane's first value of stage 0, instead of
// CuTe's copy (whose swizzled addresses it recomputed every tile). Checked here, for every lane
// of both consumer warpgroups, both stages and both 16-bit types, against CuTe's partition of the
// kernel's own SmemLayoutDSt and stmatrix tiled copy: value block k of the lane starts at that
// address, and its 8 values are 16 contiguous bytes. Two layouts: the 64-row pass (d = 128, four
// blocks a lane, the default since session 37) and the 128-row pass (d = 64, eight blocks,
// GPROJ_BWD_VARIANT 26 / 27 since session 39). The 80-row pass (d = 128, variant 39, five blocks,
// a 32-byte swizzle) by its own rule: block k at base + 256 k. And the d = 256 pass's P~ / dS~
// stores by address (check_dkvt below).
// (The extended WGMMA shapes as the d = 128 / 256 translation units have them: without the
// macro CuTe builds an N = 80 tile from five N = 16 atoms, whose copy partition differs.)
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cstdio>
#include <cstdint>

#include "../../csrc/backward/bwd_kv_sm90.cuh"
#include "../../csrc/backward/bwd_kv_dkvt_sm90.cuh"
#include "host_check.h"

using namespace cute;

template <class Traits>
void check_traits(const char* name) {
  using Element = typename Traits::Element;
  static_assert(Traits::kDsStages == 2, "two dS~ stages");
  constexpr bool kAdditive = Traits::kDqT;  // (80 rows: base + 256 k)
  constexpr int kStageBytes = Traits::kBlockM * Traits::kBlockN * int(sizeof(Element));
  constexpr int kBlocks = Traits::kBlockM / 16;  // x4 stmatrix blocks of 8 values per lane
  typename Traits::TiledMmaSdP mma;
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  // a 1024-aligned buffer, as the kernel's (SharedStorage's dS~ array is 1024-aligned), placed at
  // an odd multiple of 1024 bytes: the kernel's shared address may have bit 10 set, so a rule
  // that XORs a 1024 in (session 39's first form, wrong) fails here. Addresses are compared as
  // the kernel forms them, from the region's 2048-aligned start.
  constexpr int kElems = cosize_v<typename Traits::SmemLayoutDS>;
  alignas(2048) static char region[kElems * sizeof(Element) + 1024];
  Element* buf = reinterpret_cast<Element*>(region + 1024);
  const char* b0 = region;
  for (int tid = 0; tid < Traits::kNumMmaThreads; ++tid) {
    auto thr = r2s.get_thread_slice(tid);
    Tensor t = thr.partition_D(make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutDSt{}));
    CHECK(size(t(_, _, _, 0)) == 8 * kBlocks && size<1>(t) * size<2>(t) == 1,
          "%s: lane %d holds %d values in %d copies\n", name, tid, int(size(t(_, _, _, 0))),
          int(size<1>(t) * size<2>(t)));
    const long base = reinterpret_cast<const char*>(&t(0, 0, 0, 0)) - b0;
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < kBlocks; ++k) {
        const long want = kAdditive ? base + s * kStageBytes + 256 * k
                                    : (base + s * kStageBytes + 1024 * (k / 4)) ^ (32 * (k % 4));
        for (int e = 0; e < 8; ++e) {
          const long got = reinterpret_cast<const char*>(&t(8 * k + e, 0, 0, s)) - b0;
          CHECK(got == want + 2 * e, "%s: lane %d stage %d block %d value %d at %ld, want %ld\n",
                name, tid, s, k, e, got, want + 2 * e);
        }
      }
  }
}

// fa3 mode's d = 256 pass (csrc/backward/bwd_kv_dkvt_sm90.cuh, stmatrix_rows_at, variants 29 /
// 30): lane tid of warpgroup w = tid / 128 stores row 16 ((tid % 128) / 32) + tid % 16 of its
// keys' 8-key groups g = 0..4 (keys 40 w + 8 g..) at (g even ? even : odd) + kBufBytes buf +
// 2048 (g / 2), even = the address of group 0 in buffer 0, odd = (even + 2048 w) ^ 16: checked
// against CuTe's SmemLayoutP for every lane, both buffers, each group's 8 values contiguous.
template <typename T>
void check_dkvt(const char* name) {
  using Traits = gproj::sm90::BwdKvDkvtTraits<T, 256>;
  using Element = typename Traits::Element;
  constexpr int kElems = cosize_v<typename Traits::SmemLayoutP>;
  constexpr int kBufBytes = kElems / Traits::kTileBufs * int(sizeof(Element));
  alignas(2048) static char region[kElems * sizeof(Element) + 1024];
  Element* buf = reinterpret_cast<Element*>(region + 1024);  // (an odd multiple of 1024 on)
  Tensor s = make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutP{});
  auto at = [&](int row, int col, int b) { return long(reinterpret_cast<char*>(&s(row, col, b)) - region); };
  for (int tid = 0; tid < 256; ++tid) {
    const int w = tid / 128, row = 16 * ((tid % 128) / 32) + tid % 16;
    const long even = at(row, 40 * w, 0), odd = (even + 2048 * w) ^ 16;
    for (int b = 0; b < 2; ++b)
      for (int g = 0; g < 5; ++g) {
        const long want = (g % 2 == 0 ? even : odd) + long(kBufBytes) * b + 2048 * (g / 2);
        for (int e = 0; e < 8; ++e)
          CHECK(at(row, 40 * w + 8 * g + e, b) == want + 2 * e,
                "%s d = 256: lane %d buffer %d group %d value %d at %ld, want %ld\n", name, tid, b,
                g, e, at(row, 40 * w + 8 * g + e, b), want + 2 * e);
      }
  }
}

template <typename T>
void check_type(const char* name) {
  check_dkvt<T>(name);
  check_traits<gproj::sm90::BwdKvTraits<T, 128, false>>(name);  // fa3 mode's d = 128 default
  // the d = 64 128-row pass with its dS~ stores by address (variant 26)
  check_traits<gproj::sm90::BwdKvTraits<T, 64, false, 3, true, 2, 128, false, true, 32>>(name);
  // fa3 mode's 80-row d = 128 pass (variant 39)
  check_traits<gproj::sm90::BwdKvTraits<T, 128, false, 3, true, 2, 80>>(name);
}

int main() {
  check_type<__nv_bfloat16>("bf16");
  check_type<__half>("fp16");
  return report();
}
