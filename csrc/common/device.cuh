// Warp-level tensor-core and copy primitives (sm_80 and later), written as thin PTX wrappers so
// that every numerical step of the kernels is visible in their source.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace gproj {

using bf16 = __nv_bfloat16;
using fp16 = __half;

template <typename T> struct is_bf16 { static constexpr bool value = false; };
template <> struct is_bf16<bf16> { static constexpr bool value = true; };

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global store (p 16-byte aligned). Written as a uint4 assignment through a cast 16-bit
// pointer, the value from an asm load or make_uint4, nvcc emitted four 4-byte stores (the
// forward's O copy, the backward's dK / dV epilogue, the key centering: no st.global.v4 in their
// PTX, STG.E in their SASS; bench/NOTES.md session 43).
__device__ __forceinline__ void st_global_v4(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// ---- async copies: 16 bytes global -> shared, zero-filled when !valid ----------------------
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix -------------------------------------------------------------------------------
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// ---- mma.sync m16n8k16, fp32 accumulate ----------------------------------------------------
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (is_bf16<T>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- conversions (round to nearest even) ---------------------------------------------------
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (is_bf16<T>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<uint32_t*>(&v);
  }
  return r;
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  if constexpr (is_bf16<T>::value) {
    // A bf16 is the top half of its fp32: one shift and one mask, exactly the conversion.
    // (__bfloat1622float2 compiles to a PRMT and a shift for the high half, three instructions
    // per pair: 30% of the d = 64 Q-outer pass's key-tile loop went to such unpacking.)
    return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<__half2*>(&x));
  }
}
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<bf16>(bf16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float<fp16>(fp16 x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ fp16 from_float<fp16>(float x) { return __float2half_rn(x); }

// exp2 on the special-function unit, as FlashAttention does. ex2.approx(0) = 1 exactly, which
// the exact-max softmax relies on for the maximal element.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// acc + a . b over two 16-byte chunks of eight 16-bit values, in element order, fp32 (fused
// multiply-adds): the q . shift sum of the sm90 forward and the deltas of the λ pass and of
// delta_kernel (bwd_prepost.cuh).
template <typename T>
__device__ __forceinline__ float dot8_accumulate(uint4 a, uint4 b, float acc) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x = unpack2<T>(aw[e]), y = unpack2<T>(bw[e]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  return acc;
}

// a - b over two 16-byte chunks of eight 16-bit values, each difference rounded once, as the
// centering pre-pass rounds them (center_keys.cuh; exact wherever Sterbenz's lemma holds, as for
// the keys' shifts); the Hopper d = 256 backward's in-place Q'. bf16: sub.rn.bf16x2, the exact
// difference rounded once, 4 instructions (the fp32 form, unpack, subtract, pack, took ~28, and
// rounds twice where the difference is not exact in fp32, an exponent gap over 16).
template <typename T>
__device__ __forceinline__ uint4 sub8(uint4 a, uint4 b) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
  uint32_t r[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (is_bf16<T>::value) {
      const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&aw[e]),
                                       *reinterpret_cast<const __nv_bfloat162*>(&bw[e]));
      r[e] = *reinterpret_cast<const uint32_t*>(&d);
    } else {
      const float2 x = unpack2<T>(aw[e]), y = unpack2<T>(bw[e]);
      r[e] = pack2<T>(x.x - y.x, x.y - y.y);
    }
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// A running sum of fp32 terms kept as an unevaluated pair hi + lo, one TwoSum (Knuth) per term:
// ~48 bits, as good as an fp64 sum for the few hundred per-tile partial sums it takes, on the
// fp32 pipes. An fp64 sum costs an F2F.F64.F32 and a DADD per term, which ncu found as ~9% of
// the λ pass's warp samples (session 17). TwoSum needs IEEE adds in this order: no fast-math.
struct PairSum {
  float hi = 0.f, lo = 0.f;
  __device__ __forceinline__ void add(float x) {
    const float s = hi + x, xb = s - hi;
    lo += (hi - (s - xb)) + (x - xb);  // the exact rounding error of hi + x
    hi = s;
  }
  __device__ __forceinline__ double value() const { return double(hi) + double(lo); }
};

template <typename F>  // float or double
__device__ __forceinline__ F quad_sum(F x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  x += __shfl_xor_sync(0xffffffff, x, 2);
  return x;
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
  return x;
}

}  // namespace gproj
