// Micro-benchmark: throughput of fp32 reductions into L2, v4 vs scalar, by pattern.
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ void red4(float* g, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(g), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void red1(float* g, float a) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(g), "f"(a) : "memory");
}
// each block: `tiles` tiles of 16K floats (64 KB, like a 64x256 dQ tile), 256 threads, each
// thread 64 floats per tile. Block b adds into tile (b + t) % ntiles_total (overlapping blocks).
template <int MODE>
__global__ void k(float* acc, int tiles, int ntot, float v) {
  const int t = threadIdx.x;
  for (int it = 0; it < tiles; ++it) {
    float* g = acc + size_t((blockIdx.x + it) % ntot) * 16384 + (t / 128) * 8192;
    const int l = t % 128;
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      if (MODE == 0) red4(g + s * 512 + 4 * l, v, v, v, v);
      else if (MODE == 1) { for (int k = 0; k < 4; ++k) red1(g + s * 512 + k * 128 + l, v); }
      else { for (int k = 0; k < 4; ++k) red1(g + s * 512 + 4 * l + k, v); }
    }
  }
}
int main() {
  int ntot = 512; float* acc; cudaMalloc(&acc, size_t(ntot) * 16384 * 4);
  cudaMemset(acc, 0, size_t(ntot) * 16384 * 4);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const char* names[3] = {"v4 (lane 16 B, warp 512 B)", "scalar coalesced (warp 128 B)", "scalar strided (lane 16 B apart)"};
  for (int blocks : {sms, 64}) for (int mode = 0; mode < 3; ++mode) {
    int tiles = 200;
    for (int rep = 0; rep < 2; ++rep) {
      cudaEventRecord(a);
      if (mode == 0) k<0><<<blocks, 256>>>(acc, tiles, ntot, 1.f);
      if (mode == 1) k<1><<<blocks, 256>>>(acc, tiles, ntot, 1.f);
      if (mode == 2) k<2><<<blocks, 256>>>(acc, tiles, ntot, 1.f);
      cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b);
      double bytes = double(blocks) * tiles * 65536;
      if (rep) printf("%4d blocks  %-34s %8.3f ms  %7.1f GB/s  %6.1f GB/s per SM\n", blocks, names[mode], ms, bytes / ms / 1e6, bytes / ms / 1e6 / blocks);
    }
  }
  printf("err: %s\n", cudaGetErrorString(cudaGetLastError()));
}
