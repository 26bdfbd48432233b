// Validation and dispatch behind the C-style launch API.
//
// The Python layer validates first and gives the friendlier message; this re-checks everything
// a kernel relies on, because a wrong pointer or stride here is a silent out-of-bounds read.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "../common/cuda_check.h"
#include "launch.h"
#include "variants.h"

namespace gproj {

using bf16 = __nv_bfloat16;
using fp16 = __half;
template <typename T, int D> void forward_impl(const AttnParams&);
template <typename T, int D> void backward_impl(const AttnParams&);
template <typename T, int D> void center_keys_impl(const AttnParams&);

#define GPROJ_FOR_EACH_CONFIG(X) \
  X(bf16, 64) X(bf16, 128) X(bf16, 256) X(fp16, 64) X(fp16, 128) X(fp16, 256)

// Configurations compiled into this build: set by CMake as GPROJ_HAS_<dtype>_<hdim>.
#define GPROJ_DECLARE(dt, hd)                                       \
  extern template void forward_impl<dt, hd>(const AttnParams&);     \
  extern template void backward_impl<dt, hd>(const AttnParams&);    \
  extern template void center_keys_impl<dt, hd>(const AttnParams&);
GPROJ_FOR_EACH_CONFIG(GPROJ_DECLARE)
#undef GPROJ_DECLARE

template <typename T, int D> struct Compiled { static constexpr bool value = false; };
#define GPROJ_TRAIT(dt, hd) \
  template <> struct Compiled<dt, hd> { static constexpr bool value = GPROJ_HAS_##dt##_##hd; };
GPROJ_FOR_EACH_CONFIG(GPROJ_TRAIT)
#undef GPROJ_TRAIT

namespace {

struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

template <typename... A>
[[noreturn]] void fail(const char* fmt, A... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  throw InvalidArgument(buf);
}

void require_ptr(uint64_t ptr, const char* name) {
  if (ptr == 0) fail("%s: a device pointer is required", name);
  if (ptr % 16) fail("%s: data pointer must be 16-byte aligned (got address %% 16 = %d)", name, int(ptr % 16));
}

void require_strides(const int64_t (&s)[3], const char* name, bool varlen) {
  const char* axis[3] = {"batch", "sequence", "head"};
  // (varlen: rows packed over the batch, found through cu_seqlens; the kernels still add the
  // batch entry times stride 0, params.h)
  if (varlen && s[0] != 0) fail("%s: varlen tensors take batch stride 0 (rows are packed and found through cu_seqlens), got %lld", name, (long long)s[0]);
  for (int i = varlen ? 1 : 0; i < 3; ++i) {
    if (s[i] % 8) fail("%s: %s stride must be a multiple of 8 elements (16 bytes), got %lld", name, axis[i], (long long)s[i]);
    if (s[i] < 0) fail("%s: negative %s stride %lld is not supported", name, axis[i], (long long)s[i]);
  }
}

// What the dispatch needs to know of a device (cached): compute capability as 10 * major +
// minor, SM count (tile_grid's small-grid order, the persistent forward's grid) and L2 size (the
// persistent forward's scheduling groups).
struct DeviceProps {
  int arch = 0, sms = 0, l2_bytes = 0;
};
DeviceProps device_props(int device) {
  static std::mutex mu;
  static DeviceProps cache[64];
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= 64) fail("device index %d out of range", device);
  DeviceProps& d = cache[device];
  if (d.arch == 0) {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
    d.arch = 10 * major + minor;
  }
  return d;
}

int device_arch(int device) { return device_props(device).arch; }

// The launch's copy of the parameters with what the dispatcher sets: the device's properties and
// the A/B switches the kernels read.
AttnParams dispatched(const AttnParams& p) {
  const DeviceProps d = device_props(p.device);
  AttnParams q = p;
  q.arch = d.arch;
  q.num_sms = d.sms;
  q.l2_bytes = d.l2_bytes;
  q.tile_order = tile_order();
  q.fwd_ab = fwd_ab();
  return q;
}

void validate_common(const AttnParams& p) {
  if (p.dtype != int(DType::kBF16) && p.dtype != int(DType::kFP16)) fail("dtype code %d: expected bf16 (0) or fp16 (1)", p.dtype);
  if (p.numerics != int(Numerics::kGProj) && p.numerics != int(Numerics::kFA3)) fail("numerics code %d: expected gproj (0) or fa3 (1)", p.numerics);
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) fail("head_dim %d: supported head dims are 64, 128 and 256", p.head_dim);
  if (!is_compiled(p.dtype, p.head_dim)) fail("head_dim %d with %s is not compiled into this build (compiled: %s); rebuild with GPROJ_HEADDIMS/GPROJ_DTYPES including it", p.head_dim, p.dtype == 0 ? "bf16" : "fp16", compiled_configs());
  if (p.batch < 1 || p.batch > 65535) fail("batch %d: must be in [1, 65535]", p.batch);
  if (p.heads < 1 || p.heads > 65535 || p.heads_k < 1 || p.heads % p.heads_k) fail("heads %d / heads_k %d: need heads_k >= 1 and heads %% heads_k == 0 (heads <= 65535)", p.heads, p.heads_k);
  if (p.seqlen_q < 0 || p.seqlen_k < 0) fail("negative sequence length (%d, %d)", p.seqlen_q, p.seqlen_k);
  if (!(p.softmax_scale > 0.f) || !std::isfinite(p.softmax_scale)) fail("softmax_scale %g: must be finite and > 0", double(p.softmax_scale));
  if (p.window_left < -1 || p.window_right < -1) fail("window_size (%d, %d): entries must be >= -1", p.window_left, p.window_right);
  if ((p.cu_seqlens_q == 0) != (p.cu_seqlens_k == 0)) fail("cu_seqlens_q and cu_seqlens_k must be given together");
  if (p.cu_seqlens_q % 4 || p.cu_seqlens_k % 4) fail("cu_seqlens pointers must be 4-byte aligned");
  const bool varlen = p.cu_seqlens_q != 0;
  require_ptr(p.q, "q");
  require_ptr(p.k, "k");
  require_ptr(p.v, "v");
  require_strides(p.q_stride, "q", varlen);
  require_strides(p.k_stride, "k", varlen);
  require_strides(p.v_stride, "v", varlen);
  require_ptr(p.stats, "stats");
  if (p.stats % 8) fail("stats must be 8-byte aligned");
  if (device_arch(p.device) < 80) fail("device %d has compute capability < 8.0: the kernels need sm_80 or newer", p.device);
  if (p.cu_seqlens_q && (p.total_q <= 0 || p.total_k < 0)) fail("varlen: total_q (%d) / total_k (%d) must be set", p.total_q, p.total_k);
}

template <typename F>
int guarded(F&& f, char* err, size_t err_len) {
  auto put = [&](const char* msg) {
    if (err && err_len) {
      std::strncpy(err, msg, err_len - 1);
      err[err_len - 1] = '\0';
    }
  };
  try {
    f();
    return kOk;
  } catch (const InvalidArgument& e) {
    put(e.what());
    return kInvalidArgument;
  } catch (const CudaError& e) {
    put(e.what());
    return kCudaError;
  } catch (const std::exception& e) {
    put(e.what());
    return kCudaError;
  }
}

template <typename Fn>
void dispatch(const AttnParams& p, Fn&& fn) {
  check_cuda(cudaSetDevice(p.device), "cudaSetDevice");
#define GPROJ_CASE(dt, hd)                                                         \
  if (p.dtype == (std::is_same<dt, bf16>::value ? 0 : 1) && p.head_dim == hd) {    \
    fn(dt{}, std::integral_constant<int, hd>{});                                    \
    return;                                                                        \
  }
  GPROJ_FOR_EACH_CONFIG(GPROJ_CASE)
#undef GPROJ_CASE
  fail("no kernel for dtype %d, head_dim %d", p.dtype, p.head_dim);
}

}  // namespace

bool is_compiled(int dtype, int head_dim) {
#define GPROJ_HAS(dt, hd) if (dtype == (std::is_same<dt, bf16>::value ? 0 : 1) && head_dim == hd) return GPROJ_HAS_##dt##_##hd;
  GPROJ_FOR_EACH_CONFIG(GPROJ_HAS)
#undef GPROJ_HAS
  return false;
}

const char* compiled_configs() {
  static std::string s = [] {
    std::string r;
#define GPROJ_NAME(dt, hd) if (GPROJ_HAS_##dt##_##hd) r += std::string(r.empty() ? "" : ",") + #dt ":" #hd;
    GPROJ_FOR_EACH_CONFIG(GPROJ_NAME)
#undef GPROJ_NAME
    return r;
  }();
  return s.c_str();
}

int run_forward(const AttnParams& p, char* err, size_t err_len) {
  return guarded([&] {
    validate_common(p);
    require_ptr(p.out_f32 ? p.out_f32 : p.out, p.out_f32 ? "out_f32" : "out");
    require_strides(p.o_stride, "out", p.cu_seqlens_q != 0);
    require_ptr(p.lse, "lse");
    if (p.numerics == int(Numerics::kGProj) && p.k_shift == 0) fail("gproj numerics need k_shift (the exact key centering)");
    if (p.k_centered) require_ptr(p.k_centered, "k_centered");
    if (p.k_centered) require_strides(p.kc_stride, "k_centered", p.cu_seqlens_q != 0);
    if (p.k_center_flags && !p.k_centered) fail("k_center_flags without k_centered");
    const AttnParams q = dispatched(p);
    dispatch(q, [&](auto t, auto d) {
      using T = decltype(t);
      constexpr int D = decltype(d)::value;
      if constexpr (Compiled<T, D>::value) forward_impl<T, D>(q);
    });
  }, err, err_len);
}

int run_center_keys(const AttnParams& p, char* err, size_t err_len) {
  return guarded([&] {
    if (!is_compiled(p.dtype, p.head_dim)) fail("center keys: head_dim %d / dtype %d not compiled", p.head_dim, p.dtype);
    require_ptr(p.k, "k");
    require_strides(p.k_stride, "k", p.cu_seqlens_k != 0);
    if (p.k_centered) require_ptr(p.k_centered, "k_centered");
    if (p.k_centered) require_strides(p.kc_stride, "k_centered", p.cu_seqlens_k != 0);
    if (p.k_center_flags && !p.k_centered) fail("k_center_flags without k_centered");
    require_ptr(p.k_shift, "k_shift");
    if (!p.k_shift_given) require_ptr(p.center_workspace, "center_workspace");
    // The pass sees the keys' side only: a forward's params (gproj's forward passes its own, so
    // that the host builds one set per call) read as keys of heads_k heads; params built for
    // the keys alone (heads = heads_k, cu_seqlens_q = cu_seqlens_k) are unchanged by this.
    AttnParams kv = p;
    kv.heads = p.heads_k;
    kv.cu_seqlens_q = p.cu_seqlens_k;
    kv.seqlen_q = p.seqlen_k;
    kv.total_q = p.total_k;
    const AttnParams q = dispatched(kv);  // (GPROJ_FWD_AB bit 4: the varlen grid)
    dispatch(q, [&](auto t, auto d) {
      using T = decltype(t);
      constexpr int D = decltype(d)::value;
      if constexpr (Compiled<T, D>::value) center_keys_impl<T, D>(q);
    });
  }, err, err_len);
}

int run_backward(const AttnParams& p, char* err, size_t err_len) {
  return guarded([&] {
    validate_common(p);
    const bool varlen = p.cu_seqlens_q != 0;
    require_ptr(p.dout, "dout");
    require_strides(p.do_stride, "dout", varlen);
    if ((p.backward_passes < 1 || p.backward_passes > 4) && p.backward_passes != 8) fail("backward_passes %d: expected 1 (dQ), 2 (dK/dV), 3 (both), 4 (the Hopper λ pre-pass alone) or 8 (the Hopper KV-outer backward)", p.backward_passes);
    if (p.backward_passes == 8) {  // the Hopper backward (tile_configs.cuh, hopper_backward)
      if (p.numerics == int(Numerics::kGProj)) {
        if (p.dtype != int(DType::kBF16)) fail("backward_passes 8 (Hopper backward) with gproj numerics: bf16 only so far (fp16 takes the mma.sync passes)");
        require_ptr(p.q_shift, "q_shift (the queries' centering shift)");
        if (p.head_dim != 256) {  // (d = 256 makes Q' in shared memory)
          require_ptr(p.q_centered, "q_centered (Q - q_shift)");
          require_strides(p.qc_stride, "q_centered", varlen);
        }
      }
      if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) fail("backward_passes 8 (Hopper backward): head_dim %d, supported: 64, 128 and 256", p.head_dim);
      if (device_arch(p.device) < 90) fail("backward_passes 8 (Hopper KV-outer backward) needs sm_90 (Hopper)");
      if (p.partial) fail("backward_passes 8 (Hopper KV-outer backward) has no partial mode");
      if (hopper_bwd_projects_dk(p)) {
        require_ptr(p.dk_unprojected, "dk_unprojected (fp32, dk's strides)");
        require_ptr(p.dk_keysum, "dk_keysum (fp64, batch x heads_k x ceil(seqlen_k / 64) x (head_dim + 1))");
        if (p.dk_unprojected % 16) fail("dk_unprojected must be 16-byte aligned");
      }
      if (p.kv_head_splits != 1) {
        const int group = p.heads_k > 0 ? p.heads / p.heads_k : 0;
        if (p.kv_head_splits < 1 || group % p.kv_head_splits) fail("kv_head_splits %d: must divide the query heads per kv head (%d)", p.kv_head_splits, group);
        if (varlen) fail("kv_head_splits %d: dense inputs only (got varlen)", p.kv_head_splits);
        if (p.numerics != int(Numerics::kFA3) && p.head_dim != 256) fail("kv_head_splits %d: gproj numerics split a kv head's group at head_dim 256 only (got %d)", p.kv_head_splits, p.head_dim);
        if (p.numerics == int(Numerics::kFA3) && p.head_dim == 256 && bwd_variant() == 16) fail("kv_head_splits %d: not in fa3 mode's head-dim-split d = 256 pass (GPROJ_BWD_VARIANT=16)", p.kv_head_splits);
        require_ptr(p.dkv_accum, "dkv_accum (fp32 dK / dV partial sums and counters: hopper_dkv_accum_bytes, csrc/api/params.h)");
        if (p.dkv_accum % 16) fail("dkv_accum must be 16-byte aligned");
        if (p.dkv_accum_bytes < hopper_dkv_accum_bytes(p)) fail("dkv_accum_bytes %lld: kv_head_splits %d needs %lld", (long long)p.dkv_accum_bytes, p.kv_head_splits, (long long)hopper_dkv_accum_bytes(p));
      }
      if (hopper_bwd_uses_dq_accum(p)) require_ptr(p.dq_accum, "dq_accum (fp32, heads x dq_accum_tiles x 64 x head_dim: csrc/common/tile.cuh; zero-filled by the λ pre-pass in gproj mode, by the delta pre-pass in fa3 mode)");
    }  // (out, dq, dk, dv and their strides: checked below as for passes 1 and 2)
    if (p.kv_head_splits != 1 && p.backward_passes != 8) fail("kv_head_splits %d: only the Hopper backward (backward_passes 8) splits a kv head's group", p.kv_head_splits);
    if (p.backward_passes == 4) {  // experimental: writes rowstate only (bwd_lambda_sm90.cuh)
      if (p.numerics != int(Numerics::kGProj)) fail("backward_passes 4 (λ pre-pass) needs gproj numerics");
      if (device_arch(p.device) < 90) fail("backward_passes 4 (λ pre-pass) needs sm_90 (Hopper)");
      if (p.partial) fail("backward_passes 4 (λ pre-pass) has no partial mode");
      require_ptr(p.out, "out");
      require_strides(p.o_stride, "out", varlen);
    }
    if (p.partial != 0 && p.partial != 1) fail("partial %d: expected 0 or 1", p.partial);
    const bool gproj = p.numerics == int(Numerics::kGProj);
    const bool hopper = p.backward_passes == 8;
    const bool pass_dq = (p.backward_passes & 1) || hopper, pass_kv = (p.backward_passes & 2) || hopper;
    if (pass_dq) {  // (the dK/dV pass reads delta from rowstate, not the output)
      require_ptr(p.out, "out");
      require_strides(p.o_stride, "out", varlen);
      require_ptr(p.partial ? p.dq_accum : p.dq, p.partial ? "dq_accum" : "dq");
      require_strides(p.dq_stride, "dq", varlen);
      if (p.partial && gproj) {
        require_ptr(p.pk_accum, "pk_accum");
        require_ptr(p.rs_accum, "rs_accum");
      }
    }
    if (pass_kv) {
      require_ptr(p.partial ? p.dk_accum : p.dk, p.partial ? "dk_accum" : "dk");
      require_strides(p.dk_stride, "dk", varlen);
      require_ptr(p.partial ? p.dv_accum : p.dv, p.partial ? "dv_accum" : "dv");
      require_strides(p.dv_stride, "dv", varlen);
    }
    if (p.k_centered && !hopper) fail("k_centered in the backward: only the Hopper backward (backward_passes 8) reads it; the other passes take centered keys as k");
    if (p.k_centered) require_strides(p.kc_stride, "k_centered", varlen);
    if (p.k_center_flags && !p.k_centered) fail("k_center_flags without k_centered");
    if (p.q_center_flags && !p.q_centered) fail("q_center_flags without q_centered");
    // (a varlen tile's last rows are the next sequence's: the dQ and dK GEMMs read them, so K' and
    // Q' must be written there too)
    if ((p.k_center_flags || p.q_center_flags) && varlen) fail("k_center_flags / q_center_flags (lazy centering) in the backward: dense inputs only");
    require_ptr(p.rowstate, "rowstate");  // (16-byte aligned: float4 per row)
    if (gproj && pass_kv) require_ptr(p.q_shift, "q_shift");
    if (p.dk_accum % 16) fail("dk_accum must be 16-byte aligned");
    const AttnParams q = dispatched(p);
    dispatch(q, [&](auto t, auto d) {
      using T = decltype(t);
      constexpr int D = decltype(d)::value;
      if constexpr (Compiled<T, D>::value) backward_impl<T, D>(q);
    });
  }, err, err_len);
}

}  // namespace gproj
