// Host-side check of fa3 mode's dS~ stores in the 64-row KV-outer pass (csrc/backward/
// bwd_kv_sm90.cuh, kDsByAddress), built and run by tests/test_host_layout.py with nvcc, no GPU
// needed. The kernel stores a lane's 32 dS~ values with four stmatrix x4 at the 32-bit addresses
//   (base + stage * kDsStageBytes) ^ (32 k),  k = 0..3,
// base the shared address CuTe's partition gives the lane's first value of stage 0, instead of
// CuTe's copy (whose swizzled addresses it recomputed every tile). Checked here, for every lane
// of both consumer warpgroups, both stages and both 16-bit types, against CuTe's partition of the
// kernel's own SmemLayoutDSt and stmatrix tiled copy: value block k of the lane starts at that
// address, and its 8 values are 16 contiguous bytes.
#include <cstdio>
#include <cstdint>

#include "../../csrc/backward/bwd_kv_sm90.cuh"
#include "host_check.h"

using namespace cute;

template <typename T>
void check_type(const char* name) {
  using Traits = gproj::sm90::BwdKvTraits<T, 128, false>;  // fa3 mode's d = 128 default
  using Element = typename Traits::Element;
  static_assert(Traits::kBlockM == 64 && Traits::kDsStages == 2, "the 64-row pass, two dS~ stages");
  constexpr int kStageBytes = Traits::kBlockM * Traits::kBlockN * int(sizeof(Element));
  typename Traits::TiledMmaSdP mma;
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  // a 1024-aligned buffer, as the kernel's (SharedStorage's dS~ array is 1024-aligned)
  alignas(1024) static Element buf[cosize_v<typename Traits::SmemLayoutDS>];
  const char* b0 = reinterpret_cast<const char*>(buf);
  for (int tid = 0; tid < Traits::kNumMmaThreads; ++tid) {
    auto thr = r2s.get_thread_slice(tid);
    Tensor t = thr.partition_D(make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutDSt{}));
    CHECK(size(t(_, _, _, 0)) == 32 && size<1>(t) * size<2>(t) == 1,
          "%s: lane %d holds %d values in %d copies\n", name, tid, int(size(t(_, _, _, 0))),
          int(size<1>(t) * size<2>(t)));
    const long base = reinterpret_cast<const char*>(&t(0, 0, 0, 0)) - b0;
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < 4; ++k) {
        const long want = (base + s * kStageBytes) ^ (32 * k);
        for (int e = 0; e < 8; ++e) {
          const long got = reinterpret_cast<const char*>(&t(make_coord(e, k), 0, 0, s)) - b0;
          CHECK(got == want + 2 * e, "%s: lane %d stage %d block %d value %d at %ld, want %ld\n",
                name, tid, s, k, e, got, want + 2 * e);
        }
      }
  }
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
