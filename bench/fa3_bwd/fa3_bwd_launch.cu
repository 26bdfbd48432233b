// fa3bwd: C entry points + hdim 128 instantiations (our own code).
#include "fa3bwd_hdim.cuh"

// run_mha_bwd_hdim128, Arch >= 90:
//   causal (or local/softcap): <64, 128, 128, ..., 2, 2, true, false, false, 2, 1, 2, 1, false>
//   otherwise:                 <80, 128, 128, ..., 2, 2, true, false, true,  2, 1, 2, 1, false>
int fa3bwd_run_hdim128(Flash_bwd_params& params, cudaStream_t stream) {
    return fa3bwd::with_mask_and_group(params, [&](auto causal, auto gqa) {
        if constexpr (decltype(causal)::value)
            return fa3bwd::launch<128, 64, 128, true, decltype(gqa)::value, 2, 2, true, false, false, 2, 1, 2, 1, false>(params, stream);
        else
            return fa3bwd::launch<128, 80, 128, false, decltype(gqa)::value, 2, 2, true, false, true, 2, 1, 2, 1, false>(params, stream);
    });
}

// Defined in fa3_bwd_hdim64.cu / fa3_bwd_hdim256.cu; weak so the library still links if one failed to build.
__attribute__((weak)) int fa3bwd_run_hdim64(Flash_bwd_params& params, cudaStream_t stream);
__attribute__((weak)) int fa3bwd_run_hdim256(Flash_bwd_params& params, cudaStream_t stream);

extern "C" {

// Byte sizes of [lse_log2, dsoftmax_sum, dq_accum, dk_accum, dv_accum, dq_semaphore] as FA3's mha_bwd
// allocates them. Only dk_accum / dv_accum must be zero-filled (FA3 uses torch::zeros for them; they are
// 0 bytes unless hk != h). The others are torch::empty in FA3 (dq_accum and dq_semaphore are zeroed by
// FA3's preprocess kernel). `causal` matters because kBlockM (hence seqlen_q_rounded) depends on it.
void fa3_bwd_workspace_sizes_causal(int hdim, int causal, int b, int sq, int sk, int h, int hk, long long* sizes_out) {
    fa3bwd::Dims x{b, sq, sk, h, hk, hdim};
    fa3bwd::workspace_sizes(hdim, causal, x, sizes_out);
}

// Same, sized for the larger of the causal / non-causal layouts (safe for both).
void fa3_bwd_workspace_sizes(int hdim, int b, int sq, int sk, int h, int hk, long long* sizes_out) {
    long long a[6], c[6];
    fa3_bwd_workspace_sizes_causal(hdim, 0, b, sq, sk, h, hk, a);
    fa3_bwd_workspace_sizes_causal(hdim, 1, b, sq, sk, h, hk, c);
    for (int i = 0; i < 6; ++i) sizes_out[i] = a[i] > c[i] ? a[i] : c[i];
}

// Returns 0 on success or a cudaError_t value. Supported: hdim in {64, 128, 256} (those that were built),
// h % hk == 0 (hk != h needs a build with FA3BWD_GQA=1). Note: FA3's launch code calls exit(1) (CHECK_CUDA)
// if cudaFuncSetAttribute fails; kernel launch errors are returned here via cudaGetLastError().
int fa3_bwd(int hdim, int causal, int b, int sq, int sk, int h, int hk,
            void* q, void* k, void* v, void* o, void* dout, void* softmax_lse,
            void* dq, void* dk, void* dv,
            void* softmax_lse_log2, void* dsoftmax_sum, void* dq_accum, void* dk_accum, void* dv_accum,
            void* dq_semaphore, float softmax_scale, void* stream) {
    if (b <= 0 || sq <= 0 || sk <= 0 || h <= 0 || hk <= 0 || h % hk != 0) return int(cudaErrorInvalidValue);
    if (dq_semaphore == nullptr) return int(cudaErrorInvalidValue);  // mha_bwd always allocates it
    fa3bwd::Dims x{b, sq, sk, h, hk, hdim};
    fa3bwd::Ptrs p{q, k, v, o, dout, softmax_lse, dq, dk, dv, softmax_lse_log2, dsoftmax_sum, dq_accum, dk_accum, dv_accum, dq_semaphore};
    Flash_bwd_params params;
    fa3bwd::fill_params(params, x, causal != 0, p, softmax_scale);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaGetLastError();  // clear stale errors
    switch (hdim) {
        case 128: return fa3bwd_run_hdim128(params, s);
        case 64:  return fa3bwd_run_hdim64 ? fa3bwd_run_hdim64(params, s) : int(cudaErrorNotSupported);
        case 256: return fa3bwd_run_hdim256 ? fa3bwd_run_hdim256(params, s) : int(cudaErrorNotSupported);
        default:  return int(cudaErrorNotSupported);
    }
}

// Bitmask of built head dims: 1 = 64, 2 = 128, 4 = 256; bit 8 set if GQA variants were built.
int fa3_bwd_built() {
    return (fa3bwd_run_hdim64 ? 1 : 0) | 2 | (fa3bwd_run_hdim256 ? 4 : 0) | (FA3BWD_GQA ? 8 : 0);
}

}  // extern "C"
