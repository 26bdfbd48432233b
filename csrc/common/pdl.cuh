// Programmatic dependent launch (PDL: CUDA programming guide 4.5, PTX `griddepcontrol`) and the
// per-(sequence, kv head) completion counters that let a pass start under its predecessor's last
// wave.
//
// Why: every d = 64 pass of the gproj backward is 4096 equal blocks at B·N = 16k (31.03 waves on
// 132 SMs), so the last blocks of one pass run while the other SMs wait for the next pass: ~3% of
// each pass (bench/NOTES.md session 20). In fa3 mode the memory-bound pre- and post-passes
// (delta, dQ's rounding: ~9% of the backward at d = 128, N = 2k) can run on the SMs that the
// KV-outer pass's first and last waves leave idle. A dependent grid is launched once every block
// of its primary has executed `griddepcontrol.launch_dependents` (the primary does so as it
// starts), so its blocks take the SMs the primary frees. `griddepcontrol.wait` would then hold
// them until the whole primary has ended, which is the wave gap again; instead each dependent
// block waits only for the rows it reads, counted per (sequence, kv head) by the primary's blocks
// as they finish. The blocks run pair after pair (tile_grid), so the dependent's first blocks
// read pairs the primary finished long before. No deadlock: by the time any dependent block
// runs, every block of the primary is resident or done. Every wait is by whole warps: a warp
// whose one lane still spins while the others reach a warp-aligned barrier (`bar.sync`) is
// counted there twice (session 22's first form hung so).
#pragma once
#include <cuda_runtime.h>

namespace gproj {

// Primary: lets the dependent grid launch once every block of this grid has called it (or ended).
// A no-op when the grid has no programmatic dependent.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Dependent: waits until the primary grid has ended and its memory operations are visible. Called
// by one thread of the grid's last block before it ends, so the dependent grid never ends before
// its primary: the stream's later work, which waits for this grid, then also follows the primary.
// One thread of the last block (the last to start, when the primary is most likely done): a
// block that waited would hold its SM idle until the primary's end. (Returns at once without a
// programmatic primary.)
__device__ __forceinline__ void pdl_wait_primary_in_last_block(bool leader) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if (leader && blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1 &&
      blockIdx.z == gridDim.z - 1)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Dependent: waits until the primary grid has ended and its memory operations are visible (every
// thread that calls it). Returns at once without a programmatic primary. The forward waits so at
// its top (fwd_sm90.cuh), the centering pre-pass's second kernel likewise for its first.
__device__ __forceinline__ void pdl_wait_primary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Primary: adds `n` to a completion counter once the caller's writes, and those of every thread
// that passed a barrier with it before, are visible at GPU scope (the fence makes the counter's
// update a release of all of them).
__device__ __forceinline__ void counter_add_release(int* counter, int n) {
  __threadfence();
  asm volatile("red.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(n) : "memory");
}

// Dependent: spins until the counter reaches `target`; acquire, so the caller's later loads see
// what the adding threads wrote before.
__device__ __forceinline__ void counter_wait_acquire(const int* counter, int target) {
  int v;
  while (true) {
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    if (v >= target) break;
    __nanosleep(500);
  }
}

// Primary, after bulk (TMA) reduce-adds into global memory that a dependent reads: waits until
// this thread's bulk groups have completed their writes (cute::tma_store_wait waits only for
// their reads of shared memory), then orders those async-proxy writes before the thread's later
// generic operations, so counter_add_release then publishes them too.
__device__ __forceinline__ void bulk_writes_complete() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Dependent, after counter_wait_acquire and before bulk (TMA) reduce-adds into global memory
// that the primary wrote with generic stores: orders the acquired writes before the thread's
// later async-proxy operations.
__device__ __forceinline__ void generic_to_async_proxy_fence() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("fence.proxy.async.global;" ::: "memory");
#endif
}

// Host: launches `kernel` on `stream`; `programmatic`: as the programmatic dependent of the
// stream's previous kernel.
template <class Kernel, class... Args>
inline cudaError_t launch_kernel(Kernel kernel, dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, bool programmatic, Args const&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace gproj
