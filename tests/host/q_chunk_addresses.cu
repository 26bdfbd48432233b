// Host-side check of the forward's two walks over 16-byte chunks of the Q buffer by shared address
// (csrc/forward/fwd_sm90.cuh, FwdTraits::q_chunk_addr and o_row_addr), built and run by
// tests/test_host_layout.py with nvcc, no GPU needed. The kernel forms the first chunk's address
// through CuTe's SmemLayoutQ and the rest by those rules; checked here against CuTe's layout for
// every thread of every consumer warpgroup, every forward variant's kernel at head dims 64 / 128 /
// 256 and both 16-bit types:
//   q . shift: lane l of a quad reads chunks (l mod 4) + 4 j of its two accumulator rows (the
//     P.V accumulator's partition: row0 and row0 + 8, 1024 bytes apart) at q_chunk_addr(a0 +
//     1024 r, j), a0 the address of chunk l mod 4 of row0;
//   O's copy where TMA cannot store it: thread t of warpgroup w reads chunk t mod kOChunks of rows
//     64 w + t div kOChunks + kORowStep i at o_row_addr(a0, i), a0 that of the first.
// Each chunk's 8 values must also be 16 contiguous bytes. The buffer sits at an odd multiple of
// 1024 bytes (the kernel's may have bit 10 set), addresses taken from a 2048-aligned start.
#include <cstdio>
#include <cstdint>

#include "../../csrc/forward/fwd_sm90.cuh"
#include "host_check.h"

using namespace cute;

template <typename T, int kHeadDim, int kVariant>
void check(const char* type) {
  using Traits = typename gproj::sm90::FwdVariant<T, kHeadDim, kVariant>::Traits;
  using Element = typename Traits::Element;
  constexpr int kElems = cosize_v<typename Traits::SmemLayoutQ>;
  alignas(2048) static char region[kElems * sizeof(Element) + 1024];
  Element* buf = reinterpret_cast<Element*>(region + 1024);
  Tensor sQ = make_tensor(make_smem_ptr(buf), typename Traits::SmemLayoutQ{});
  auto at = [&](int row, int col) {
    return uint32_t(reinterpret_cast<char*>(&sQ(row, col)) - region);
  };
  auto contiguous = [&](int row, int col) {
    for (int e = 1; e < 8; ++e)
      if (at(row, col + e) != at(row, col) + 2 * e) return false;
    return true;
  };
  typename Traits::TiledMmaPV mma_pv;
  constexpr int kChunks = kHeadDim / 8;
  for (int tid = 0; tid < Traits::kNumMmaThreads; ++tid) {
    // q . shift, on the rows of the lane's P.V accumulator (as the kernel's oc_rc)
    auto thr_pv = mma_pv.get_thread_slice(tid);
    Tensor tOcO =
        thr_pv.partition_C(make_identity_tensor(select<0, 2>(typename Traits::TileShape{})));
    Tensor oc_rc = make_tensor(tOcO.data(), gproj::sm90::acc_rowcol(tOcO.layout()));
    CHECK(size<0>(oc_rc) == 2, "%s d = %d v%d: %d accumulator rows\n", type, kHeadDim, kVariant,
          int(size<0>(oc_rc)));
    const int row0 = get<0>(oc_rc(0, 0)), c = tid & 3;
    const uint32_t a0 = at(row0, 8 * c);
    for (int r = 0; r < 2; ++r) {
      const int row = get<0>(oc_rc(r, 0));
      CHECK(row == row0 + 8 * r, "%s d = %d v%d: thread %d row %d is %d, not row0 + 8 r\n", type,
            kHeadDim, kVariant, tid, r, row);
      for (int j = 0; j < kChunks / 4; ++j) {
        const int col = 8 * (c + 4 * j);
        const uint32_t got = Traits::q_chunk_addr(a0 + 1024 * r, j), want = at(row, col);
        CHECK(got == want && contiguous(row, col),
              "%s d = %d v%d: q . shift thread %d row %d chunk %d at %u, want %u\n", type,
              kHeadDim, kVariant, tid, row, c + 4 * j, got, want);
      }
    }
    // O's copy by the threads
    const int w = tid / 128, t = tid % 128;
    const int col = (t % Traits::kOChunks) * 8, first = 64 * w + t / Traits::kOChunks;
    const uint32_t b0 = at(first, col);
    for (int i = 0; i < 64 / Traits::kORowStep; ++i) {
      const int row = first + Traits::kORowStep * i;
      const uint32_t got = Traits::o_row_addr(b0, i), want = at(row, col);
      CHECK(got == want && contiguous(row, col),
            "%s d = %d v%d: O copy thread %d row %d chunk %d at %u, want %u\n", type, kHeadDim,
            kVariant, tid, row, col / 8, got, want);
    }
  }
}

template <typename T, int kHeadDim, int... kVariants>
void check_variants(const char* type, std::integer_sequence<int, kVariants...>) {
  (check<T, kHeadDim, kVariants>(type), ...);
}

template <typename T>
void check_type(const char* type) {
  // variants 0-12 (GPROJ_FWD_VARIANT; several are the same kernel at a head dim)
  check_variants<T, 64>(type, std::make_integer_sequence<int, 13>{});
  check_variants<T, 128>(type, std::make_integer_sequence<int, 13>{});
  check_variants<T, 256>(type, std::make_integer_sequence<int, 13>{});
}

int main() {
  check_type<__nv_bfloat16>("bf16");
  check_type<__half>("fp16");
  return report();
}
