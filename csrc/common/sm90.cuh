// What the sm90 (Hopper) kernels share: CuTe element types, TMA views of q/k/v/dO-like tensors
// and their loads, the tile/warpgroup layout of a block (Sm90Tiles), accumulator layout views,
// warpgroup GEMM issue, and the named barriers the consumer warpgroups use.
// Named barriers: 0 __syncthreads; 4-7 and 14-15 the dQ staging handshake of the KV-outer
// backward (dq_staged / dq_free); 8-10 pingpong turns (turn_wait / turn_pass); 10 both consumer
// warpgroups of the KV-outer backward (consumers_sync); 11-13 one consumer warpgroup (wg_sync).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "../api/params.h"
#include "cuda_check.h"
#include "device.cuh"
#include "pdl.cuh"

namespace gproj {
namespace sm90 {

using namespace cute;

// CuTe's TMA and GMMA atoms are written for CUTLASS's numeric types (bit-identical to CUDA's).
template <typename T> struct CuteElement;
template <> struct CuteElement<bf16> { using type = cutlass::bfloat16_t; };
template <> struct CuteElement<fp16> { using type = cutlass::half_t; };

// ---- TMA views shared by the sm90 kernels: q, k, v, dO as (rows, head dim, head, batch) ----
using TmaGmemLayout =
    Layout<Shape<int32_t, int32_t, int32_t, int32_t>, Stride<int64_t, _1, int64_t, int64_t>>;

// The TMA load of `Tile`-shaped boxes into `SmemLayout`.
template <class Element, class SmemLayout, class Tile>
using TmaLoad = decltype(make_tma_copy(
    SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), TmaGmemLayout{}),
    SmemLayout{}, Tile{}, _1{}));

// Host: the global tensor a TMA load reads (varlen: the packed rows as one batch entry).
template <class Element>
inline auto tma_gmem(uint64_t ptr, int rows, int head_dim, int heads, int batch,
                     const int64_t (&st)[3], bool varlen) {
  // A size-1 batch mode still needs a legal TMA stride: any multiple of 16 bytes works.
  const int64_t bstride = varlen ? int64_t(rows) * st[1] : st[0];
  return make_tensor(make_gmem_ptr(reinterpret_cast<Element const*>(ptr)),
                     make_layout(make_shape(rows, head_dim, heads, batch),
                                 make_stride(st[1], _1{}, st[2], bstride > 0 ? bstride : int64_t(8))));
}

// Device: the rows of one (sequence, head), starting at the sequence's first row.
template <class Tma>
__device__ __forceinline__ auto tma_rows(Tma const& tma, int rows, int head_dim, int heads,
                                         int batch, int start, int head, int b) {
  return domain_offset(make_coord(start, _0{}),
                       tma.get_tma_tensor(make_shape(rows, head_dim, heads, batch))(_, _, head, b));
}

// What every sm90 kernel here shares: a query tile of 64 rows per consumer warpgroup (two, or
// three in the d = 64 forward) and kBlockN-row key tiles over the head dim, one producer
// warpgroup, Q-like tiles and a kStages ring of K-like tiles in shared memory (K-major, swizzled
// for WGMMA), their TMA loads, and the mbarrier pipeline type of the ring.
template <typename T_, int kHeadDim_, int kBlockN_, int kStages_, int kMmaWarpGroups_ = 2>
struct Sm90Tiles {
  using T = T_;                                     // CUDA type (global stores)
  using Element = typename CuteElement<T_>::type;   // CuTe type (TMA, GMMA)
  static constexpr int kHeadDim = kHeadDim_, kBlockM = 64 * kMmaWarpGroups_, kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kNumMmaWarpGroups = kMmaWarpGroups_;
  // Registers per thread after setmaxnreg (the file holds 64K): the producer keeps 24, the
  // consumers share the rest in multiples of 8 (240 with two of them, 160 with three).
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kMmaWarpGroups_ == 2 ? 240 : 160;
  static constexpr int kNumMmaThreads = kNumMmaWarpGroups * 128;
  static constexpr int kNumThreads = kNumMmaThreads + 128;
  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;
  using AtomLayout = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;
  // S = Q K^T (and dP = dO V^T): A and B from shared memory, both K-major.
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      AtomLayout{}));
  using SmemAtomQ = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                             GMMA::Major::K, Element, Int<kBlockM>, Int<kHeadDim>>());
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomQ{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemAtomKV = decltype(cutlass::gemm::collective::detail::ss_smem_selector<
                              GMMA::Major::K, Element, Int<kBlockN>, Int<kHeadDim>>());
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtomKV{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // The P V form (the forward's O = P V, the gproj λ pass's dS~ K' and P~ K'): A from registers
  // in the S accumulator's layout, B = a K-like ring tile read MN-major (head dim contiguous).
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));
  // ... and that B: the same bytes as the K-like ring, indexed (head dim, key, stage).
  using SmemLayoutVt = decltype(composition(
      SmemLayoutK{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                                         Step<_2, _1, _3>{})));
  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;
  using TmaQ = TmaLoad<Element, SmemLayoutQ, decltype(select<0, 2>(TileShape{}))>;
  using TmaKV =
      TmaLoad<Element, decltype(take<0, 2>(SmemLayoutK{})), decltype(select<1, 2>(TileShape{}))>;

  // Params of a K-like tile ring for warpgroup `wg` (0: the producer, whose thread 0 leads).
  __device__ static typename Pipeline::Params ring_params(int wg) {
    typename Pipeline::Params pp;
    pp.transaction_bytes = kBlockN * kHeadDim * int(sizeof(Element));
    pp.role = wg == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pp.is_leader = threadIdx.x == 0;
    pp.num_consumers = kNumMmaThreads;
    return pp;
  }
};

// Host: the TMA loads of a Q-like (rows of q / dO) and a K-like (rows of k / v) tensor.
template <class Tiles>
typename Tiles::TmaQ make_tma_q(uint64_t ptr, int rows, int heads, int batch,
                                const int64_t (&st)[3], bool varlen) {
  return make_tma_copy(SM90_TMA_LOAD{},
                       tma_gmem<typename Tiles::Element>(ptr, rows, Tiles::kHeadDim, heads, batch, st, varlen),
                       typename Tiles::SmemLayoutQ{}, select<0, 2>(typename Tiles::TileShape{}), _1{});
}
template <class Tiles>
typename Tiles::TmaKV make_tma_kv(uint64_t ptr, int rows, int heads, int batch,
                                  const int64_t (&st)[3], bool varlen) {
  return make_tma_copy(SM90_TMA_LOAD{},
                       tma_gmem<typename Tiles::Element>(ptr, rows, Tiles::kHeadDim, heads, batch, st, varlen),
                       take<0, 2>(typename Tiles::SmemLayoutK{}), select<1, 2>(typename Tiles::TileShape{}), _1{});
}

// Host: the extents of every sm90 kernel's TMA tensors (varlen: the packed rows, one batch entry).
template <class Prm>
void set_tma_extents(Prm& prm, const AttnParams& p, int total_q, int total_k) {
  const bool varlen = p.cu_seqlens_q != 0;
  prm.p = p;
  prm.rows_q = varlen ? total_q : p.seqlen_q;
  prm.rows_k = varlen ? total_k : p.seqlen_k;
  prm.batch_q = varlen ? 1 : p.batch;
}

// Host: opt the kernel in to its shared memory (done on every launch, so that a kernel first
// used on a second device is set up too) and launch it on the caller's stream; `programmatic`:
// as the programmatic dependent of the stream's previous kernel (pdl.cuh).
template <class Kernel, class Prm>
void launch_sm90(Kernel kernel, dim3 grid, int threads, int smem, const Prm& prm,
                 const AttnParams& p, const char* name, bool programmatic = false) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), name);
  check_cuda(launch_kernel(kernel, grid, dim3(threads), size_t(smem),
                           reinterpret_cast<cudaStream_t>(p.stream), programmatic, prm),
             name);
  check_cuda(cudaGetLastError(), name);
}

// Accumulator ((2, 2, V), M, N) -> (rows, cols) view: the lane's rows and columns.
template <class L>
__host__ __device__ __forceinline__ auto acc_rowcol(L l) {
  auto l0 = get<0>(l);
  return make_layout(make_layout(get<1>(l0), get<1>(l)),
                     make_layout(get<0>(l0), get<2>(l0), get<2>(l)));
}

// The register holding the 16-bit pair (r, j), (r, j + 1) (j even) of a row/column view of a
// 16-bit copy of an accumulator: a lane's adjacent columns share one 32-bit register, so a pair
// is converted, unpacked or stored as one value.
template <class T>
__device__ __forceinline__ uint32_t& reg_pair(T& t, int r, int j) {
  return *reinterpret_cast<uint32_t*>(&t(r, j));
}

// Masks a row/column view of an accumulator (with its coordinates, the same view of an identity
// tensor) by one range of visible columns per row: the element at column offset `off` from the
// lane's first column keeps its value iff lo <= off < hi, where row_bounds(row, first column,
// lo, hi) gives the row's range; else it becomes `fill`. The offsets are compile-time
// constants of the accumulator layout, so only the two bounds per row are live (per-element
// coordinates held in the forward's key loop once spilled 9 KB, bench/NOTES.md session 7).
// kTestLo / kTestHi drop a test whose bound cannot cut, e.g. under a causal mask: one compare
// per element instead of two (bench/NOTES.md session 16, items 9 and 11).
template <bool kTestLo, bool kTestHi, class TS, class TC, class RowBounds>
__host__ __device__ __forceinline__ void mask_row_ranges(TS& s_rc, TC const& c_rc,
                                                         RowBounds const& row_bounds, float fill) {
  const int col0 = get<1>(c_rc(0, 0));
  CUTLASS_PRAGMA_UNROLL
  for (int r = 0; r < size<0>(s_rc); ++r) {
    int lo, hi;
    row_bounds(get<0>(c_rc(r, 0)), col0, lo, hi);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < size<1>(s_rc); ++j) {
      const int off = get<1>(c_rc(r, j)) - col0;
      if ((kTestLo && off < lo) || (kTestHi && off >= hi)) s_rc(r, j) = fill;
    }
  }
}

// Accumulator of S (64 x kBlockN per warpgroup) -> A-operand register layout of the PV GEMM
// (k = kBlockN in slabs of 16): the third value mode splits into (2, kBlockN / 16).
template <class L>
__device__ __forceinline__ auto acc_to_a_layout(L l) {
  auto split = logical_divide(get<0, 2>(l), Tile<_2>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(split)), get<1>(l),
                     coalesce(make_layout(get<0, 1>(split), get<2>(l))));
}

// Pingpong turn-taking between the consumer warpgroups (named barriers 8, 9 and 10 with three;
// 0 is __syncthreads, CUTLASS reserves the low ids). Warpgroup w waits for its turn on barrier
// 8 + w, issues its GEMMs, then hands the turn to the next one, round robin: bar.arrive on the
// next one's barrier. Each barrier completes when 256 threads have arrived (128 waiting + 128
// arriving).
__device__ __forceinline__ void turn_wait(int consumer) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(8 + consumer) : "memory");
}
template <int kConsumers = 2>
__device__ __forceinline__ void turn_pass(int consumer) {
  const int next = consumer + 1 == kConsumers ? 0 : consumer + 1;
  asm volatile("bar.arrive %0, 256;\n" ::"r"(8 + next) : "memory");
}
// An arrive on a CTA-local mbarrier by the threads where `pred` holds. The predicate is a data
// dependence of the arrive (the forward makes it one that always holds, computed from a softmax
// value, so that ptxas cannot schedule the arrive, nor a wgmma wait after it, above that value;
// FwdTraits::kPvWaitInSoftmax).
__device__ __forceinline__ void mbarrier_arrive_if(const void* bar, bool pred) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n"
      ::"r"(a), "r"(uint32_t(pred)) : "memory");
}
// One consumer warpgroup's own barrier (named barriers 11-13, 128 threads; the backward uses 10
// for both its consumer warpgroups together).
__device__ __forceinline__ void wg_sync(int consumer) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(11 + consumer) : "memory");
}

// 16-byte shared-memory load and store through a generic pointer into shared memory: the address
// a swizzled CuTe layout computes (an XOR of address bits) hides its space from the compiler,
// which then emits generic LD / ST, slower than LDS / STS.
__device__ __forceinline__ uint4 ld_shared_v4_at(uint32_t a) {  // (a: a shared address)
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_shared_v4(const void* p) {
  return ld_shared_v4_at(static_cast<uint32_t>(__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void st_shared_v4(void* p, uint4 v) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// A position in a pipeline ring of kStages stages held as one count (of the stages taken since
// the start), where CUTLASS's PipelineState keeps the stage index and the phase in registers of
// their own: two registers fewer for a thread with two rings, which the d = 256 forward's
// producer (24 registers) and consumers (240) both lacked. It converts to the PipelineState that
// as many increments from the start state give (stage n mod kStages, the phase flipped every
// kStages; kStartPhase: 1 for a producer, as make_producer_start_state, 0 for a consumer).
template <int kStages, uint32_t kStartPhase>
struct RingCount {
  int n = 0;
  __device__ __forceinline__ int index() const { return n % kStages; }
  __device__ __forceinline__ uint32_t phase() const {
    return uint32_t((n / kStages) & 1) ^ kStartPhase;
  }
  __device__ __forceinline__ RingCount& operator++() {
    ++n;
    return *this;
  }
  __device__ __forceinline__ operator cutlass::PipelineState<kStages>() const {
    return {index(), phase(), uint32_t(n)};
  }
};

// threadIdx.x, read by an instruction of its own where it is used: what is derived from it there
// is formed there. (From a thread index read once before a persistent loop, ptxas forms a tile's
// loop-invariant addresses before the loop and keeps them across it, in registers or, short of
// them, on the stack.)
__device__ __forceinline__ int fresh_thread_index() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Whether stage_and_store_rows may write a 16-bit tensor (pointer, strides in elements): 16-byte
// rows, i.e. a 16-byte aligned pointer and strides multiples of 8 elements, and not turned off
// for A/B runs (GPROJ_FWD_AB bit 32: the per-thread stores from the accumulators).
__device__ __forceinline__ bool rows_stageable(const AttnParams& p, uint64_t ptr,
                                               const int64_t (&stride)[3]) {
  return !(p.fwd_ab & 32) && (ptr & 15) == 0 && ((stride[0] | stride[1] | stride[2]) & 7) == 0;
}

// The epilogue stores of a 16-bit tile that a consumer warpgroup holds in accumulator form
// (`r16`: its accumulator values already rounded, partitioned by `mma` as the accumulator was),
// through shared memory: stmatrix into `s` (the tile's swizzled shared layout, rows x columns;
// the caller has made sure nobody still reads what this warpgroup overwrites), then rows
// [r0, r0 + 64) x columns [c0, c0 + kCols), the part warpgroup w holds, to global memory (g: the
// tile's row 0, column 0; rows from rows_valid on dropped), 16 bytes per thread, a row's bytes by
// consecutive threads. Stored from the accumulators directly, each 4-byte store of a warp touches
// 8 rows (8 half-used sectors); ncu put 3-5% of the fa3 KV-outer pass's warp samples at d = 128
// N = 4k into those stores (bench/NOTES.md session 19).
template <int kCols, class T, class TiledMma, class Frag, class SmemTile>
__device__ __forceinline__ void stage_and_store_rows(T* g, int64_t row_stride, int rows_valid,
                                                     int r0, int c0, int w, int tid,
                                                     TiledMma const& mma, Frag const& r16,
                                                     SmemTile& s) {
  using Element = typename SmemTile::value_type;
  static_assert(sizeof(Element) == 2 && kCols % 8 == 0 && 128 % (kCols / 8) == 0, "16-byte chunks");
  auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
  auto r2s_thr = r2s.get_thread_slice(tid);
  copy(r2s, r2s_thr.retile_S(r16), r2s_thr.partition_D(s));
  wg_sync(w);  // (the warpgroup reads back only what it wrote)
  constexpr int kChunks = kCols / 8, kRowsPerPass = 128 / kChunks;
  const int t = tid & 127, col = c0 + (t % kChunks) * 8;
  CUTLASS_PRAGMA_UNROLL
  for (int r = t / kChunks; r < 64; r += kRowsPerPass) {
    // (a 16-byte chunk of a row is contiguous in the swizzled layout: the swizzle moves whole
    // 16-byte units)
    if (r0 + r < rows_valid)
      st_global_v4(g + int64_t(r0 + r) * row_stride + col, ld_shared_v4(&s(r0 + r, col)));
  }
}

// Both consumer warpgroups of the KV-outer backward where they meet every tile (named barrier 10;
// ids 8-9 are the pingpong turns of gproj's pass, 8-10 with three warpgroups, where this one is
// never used): bwd_kv_sm90.cuh with dQ there, bwd_kv_split_sm90.cuh, bwd_kv_dkvt_sm90.cuh.
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 10, 256;\n" ::: "memory");
}

// The KV-outer backward's dQ staging (bwd_kv_sm90.cuh): consumer warpgroup w and the producer
// warpgroup's dQ writer warp, 160 threads per barrier. Barrier 4 + w: w has staged its dQ tile
// (the consumers arrive, the writer waits); 6 + w: the writer's bulk reduce-add has read the
// buffer (the writer arrives, the consumers wait); with two buffers per warpgroup, 6 + w for
// buffer 0 and 14 + w for buffer 1.
__device__ __forceinline__ void dq_staged_arrive(int w) {
  asm volatile("bar.arrive %0, 160;\n" ::"r"(4 + w) : "memory");
}
__device__ __forceinline__ void dq_staged_wait(int w) {
  asm volatile("bar.sync %0, 160;\n" ::"r"(4 + w) : "memory");
}
__device__ __forceinline__ int dq_free_barrier(int w, int buffer) { return (buffer ? 14 : 6) + w; }
__device__ __forceinline__ void dq_free_arrive(int w, int buffer = 0) {
  asm volatile("bar.arrive %0, 160;\n" ::"r"(dq_free_barrier(w, buffer)) : "memory");
}
__device__ __forceinline__ void dq_free_wait(int w, int buffer = 0) {
  asm volatile("bar.sync %0, 160;\n" ::"r"(dq_free_barrier(w, buffer)) : "memory");
}

// gmem[0..3] += v, one vector reduction in L2 (sm_90; the order of the adds varies between
// runs): the d = 256 KV-outer passes' dQ (bwd_kv_split_sm90.cuh, bwd_kv_dkvt_sm90.cuh).
__device__ __forceinline__ void red_add_f32x4(float* gmem, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(gmem), "f"(v.x),
               "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// cp.async of one 4-, 8- or 16-byte value, zero-filled (nothing read) when !ok.
template <class V>
__device__ __forceinline__ void cp_async_zfill(V* smem, const V* gmem, bool ok) {
  static_assert(sizeof(V) == 4 || sizeof(V) == 8 || sizeof(V) == 16, "cp.async.ca moves 4, 8 or 16 bytes");
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem),
               "n"(int(sizeof(V))), "r"(ok ? int(sizeof(V)) : 0) : "memory");
}

// stmatrix of four 8x8 blocks of 16-bit values (not transposed): each lane holds one packed pair
// per block (a, b, c, d) and gives the shared address of one 16-byte block row (lanes 8i..8i+7
// the rows of block i), as cute's SM90_U32x4_STSM_N with a 32-bit address taken beforehand.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c,
                                            uint32_t d) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(a), "r"(b), "r"(c), "r"(d));
}

// A warpgroup's slice of a TiledMma, for the fragments of its shared-memory operands (the GMMA
// descriptors). Indexed by the warpgroup, which canonical_warp_group_idx broadcasts with a
// shuffle, so the compiler knows the value is warp-uniform and builds the descriptors in uniform
// registers. Sliced by thread (tid / 128 is the same number, but not provably uniform), the
// descriptors of an operand split across warpgroups, such as Q in the forward's S = Q K^T, were
// computed per thread, held in 16 ordinary registers and moved with two R2UR before every HGMMA
// (SASS, bench/NOTES.md session 13). Accumulator partitions (partition_C) stay per thread.
template <class TiledMma>
__device__ __forceinline__ auto warpgroup_slice(TiledMma const& mma, int warpgroup) {
  return mma.get_slice(warpgroup * cutlass::NumThreadsPerWarpGroup);
}

// One WGMMA batch: C (+)= A B over the k mode, committed, not waited.
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wg_gemm(Mma& mma, TA const& a, TB const& b, TC& c) {
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, _, kb), b(_, _, kb), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
}

// wg_gemm of M atom m alone (a: (V, M, K) descriptors, b: (V, 1, K), c: (V, M, 1)), one batch:
// so that a tile's GEMMs can be issued atom by atom with other work between them. Only atom m's
// accumulator registers are fenced (fencing the others would make ptxas wait for a GEMM still
// in flight on them).
template <bool kZeroInit, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void wg_gemm_atom(Mma& mma, TA const& a, TB const& b, TC& c, int m) {
  auto cm = c(_, m, 0);
  warpgroup_fence_operand(cm);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int kb = 0; kb < size<2>(a); ++kb) {
    cute::gemm(mma, a(_, m, kb), b(_, 0, kb), cm);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(cm);
}

}  // namespace sm90
}  // namespace gproj
