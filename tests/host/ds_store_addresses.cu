// Host-side check of fa3 mode's dS~ stores in the KV-outer pass (csrc/backward/bwd_kv_sm90.cuh,
// kDsByAddress), built and run by tests/test_host_layout.py with nvcc, no GPU needed. The kernel
// stores a lane's dS~ values with x4 stmatrix at the 32-bit addresses
//   (base + stage * kDsStageBytes) ^ (32 (k mod 4) + 1024 (k div 4)),  k = 0 .. blocks - 1,
// base the shared address CuTe's partition gives the lane's first value of stage 0, instead of
// CuTe's copy (whose swizzled addresses it recomputed every tile). Checked here, for every lane
// of both consumer warpgroups, both stages and both 16-bit types, against CuTe's partition of the
// kernel's own SmemLayoutDSt and stmatrix tiled copy: value block k of the lane starts at that
// address, and its 8 values are 16 contiguous bytes. Two layouts: the 64-row pass (d = 128, four
// blocks a lane, the default since session 37) and the 128-row pass (d = 64, eight blocks,
// GPROJ_BWD_VARIANT 26 / 27 since session 39).
#include <cstdio>
#include <cstdint>

#include "../../csrc/backward/bwd_kv_sm90.cuh"
#include "host_check.h"

using namespace cute;

template <class Traits>
void check_traits(const char* name) {
  using Element = typename Traits::Element;
  static_assert(Traits::kDsStages == 2, "two dS~ stages");
  constexpr int kStageBytes = Traits::kBlockM * Traits::kBlockN * int(sizeof(Element));
  constexpr int kBlocks = Traits::kBlockM / 16;  // x4 stmatrix blocks of 8 values per lane
  typename Traits::TiledMmaSdP mma;
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  // a 1024-aligned buffer, as the kernel's (SharedStorage's dS~ array is 1024-aligned)
  alignas(1024) static Element buf[cosize_v<typename Traits::SmemLayoutDS>];
  const char* b0 = reinterpret_cast<const char*>(buf);
  for (int tid = 0; tid < Traits::kNumMmaThreads; ++tid) {
    auto thr = r2s.get_thread_slice(tid);
    Tensor t = thr.partition_D(make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutDSt{}));
    CHECK(size(t(_, _, _, 0)) == 8 * kBlocks && size<1>(t) * size<2>(t) == 1,
          "%s: lane %d holds %d values in %d copies\n", name, tid, int(size(t(_, _, _, 0))),
          int(size<1>(t) * size<2>(t)));
    const long base = reinterpret_cast<const char*>(&t(0, 0, 0, 0)) - b0;
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < kBlocks; ++k) {
        const long want = (base + s * kStageBytes) ^ (32 * (k % 4) + 1024 * (k / 4));
        for (int e = 0; e < 8; ++e) {
          const long got = reinterpret_cast<const char*>(&t(8 * k + e, 0, 0, s)) - b0;
          CHECK(got == want + 2 * e, "%s: lane %d stage %d block %d value %d at %ld, want %ld\n",
                name, tid, s, k, e, got, want + 2 * e);
        }
      }
  }
}

template <typename T>
void check_type(const char* name) {
  check_traits<gproj::sm90::BwdKvTraits<T, 128, false>>(name);  // fa3 mode's d = 128 default
  // the d = 64 128-row pass with its dS~ stores by address (variant 26)
  check_traits<gproj::sm90::BwdKvTraits<T, 64, false, 3, true, 2, 128, false, true, 32>>(name);
}

int main() {
  check_type<__nv_bfloat16>("bf16");
  check_type<__half>("fp16");
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("all checks passed\n");
  return 0;
}
