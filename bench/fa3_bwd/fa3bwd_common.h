// fa3bwd: standalone launcher for FlashAttention-3's Hopper backward (our own code, not FA3's).
// Mirrors hopper/flash_api.cpp: set_params_fprop / set_params_dgrad / mha_bwd for the case
// bf16, non-varlen, (batch, seqlen, heads, headdim) contiguous tensors, no dropout, no softcap,
// not deterministic, causal or full attention (no sliding window), sm_margin = 0.
#pragma once
#include <cstring>
#include <cuda_runtime.h>
#include "cutlass/numeric_types.h"
#include "flash.h"

namespace fa3bwd {

inline int round_multiple(int x, int m) { return (x + m - 1) / m * m; }

// round_up_headdim() in flash_api.cpp (all hdims enabled)
inline int round_up_headdim(int d) {
    if (d <= 64) return 64;
    if (d <= 96) return 96;
    if (d <= 128) return 128;
    if (d <= 192) return 192;
    return 256;
}

// kBlockM / kBlockN exactly as mha_bwd computes them for arch >= 90, softcap == 0, not local.
inline int kblock_m_sm90(int hdim_rounded, bool causal) {
    return hdim_rounded <= 64 ? 128
         : (hdim_rounded <= 96 ? 64
         : (hdim_rounded <= 128 ? (causal ? 64 : 80) : 64));
}
inline int kblock_n_sm90(int hdim_rounded) {
    return hdim_rounded <= 128 ? 128 : (hdim_rounded <= 192 ? 96 : 80);
}

struct Dims { int b, sq, sk, h, hk, d; };

// Byte sizes of the workspaces mha_bwd allocates (non-varlen), in this order:
//  0 softmax_lse_log2 fp32 (b, h, seqlen_q_rounded)                     torch::empty
//  1 dsoftmax_sum     fp32 (b, h, seqlen_q_rounded)                     torch::empty
//  2 dq_accum         fp32 (b, h, seqlen_q_rounded * d_rounded)         torch::empty (zeroed by the preprocess kernel)
//  3 dk_accum         fp32 (b, hk, seqlen_k_rounded * d_rounded)        torch::zeros, GQA (hk != h) only, else 0
//  4 dv_accum         fp32 (b, hk, seqlen_k_rounded * dv_rounded)       torch::zeros, GQA only, else 0
//  5 dq_semaphore     int32 (ceil(sq / kBlockM), b, h)                  torch::empty (zeroed by the preprocess kernel)
inline void workspace_sizes(int hdim, int causal, Dims const& x, long long* out) {
    int const dr = round_up_headdim(hdim);
    int const kM = kblock_m_sm90(dr, causal != 0);
    int const kN = kblock_n_sm90(dr);
    long long const sqr = round_multiple(x.sq, kM), skr = round_multiple(x.sk, kN);
    out[0] = 4LL * x.b * x.h * sqr;
    out[1] = 4LL * x.b * x.h * sqr;
    out[2] = 4LL * x.b * x.h * sqr * dr;
    out[3] = x.hk != x.h ? 4LL * x.b * x.hk * skr * dr : 0;
    out[4] = x.hk != x.h ? 4LL * x.b * x.hk * skr * dr : 0;
    out[5] = 4LL * ((x.sq + kM - 1) / kM) * x.b * x.h;
}

struct Ptrs {
    void *q, *k, *v, *o, *dout, *lse, *dq, *dk, *dv, *lse_log2, *dsoftmax_sum, *dq_accum, *dk_accum, *dv_accum, *dq_semaphore;
};

inline void fill_params(Flash_bwd_params& params, Dims const& x, bool causal, Ptrs const& p, float softmax_scale) {
    std::memset(&params, 0, sizeof(params));   // set_params_fprop starts with `params = {};`
    int const dr = round_up_headdim(x.d);
    int const kM = kblock_m_sm90(dr, causal);
    int const kN = kblock_n_sm90(dr);
    // contiguous (b, s, h, d) strides in elements
    long long const q_row = (long long)x.h * x.d, q_head = x.d, q_batch = (long long)x.sq * x.h * x.d;
    long long const k_row = (long long)x.hk * x.d, k_head = x.d, k_batch = (long long)x.sk * x.hk * x.d;

    // ---- set_params_fprop ----
    params.is_bf16 = true;
    params.is_e4m3 = false;
    params.q_ptr = p.q; params.k_ptr = p.k; params.v_ptr = p.v;
    params.q_row_stride = q_row; params.k_row_stride = k_row; params.v_row_stride = k_row;
    params.q_head_stride = q_head; params.k_head_stride = k_head; params.v_head_stride = k_head;
    params.v_dim_stride = 1;
    params.o_ptr = p.o;
    params.o_row_stride = q_row; params.o_head_stride = q_head;
    params.q_batch_stride = q_batch; params.k_batch_stride = k_batch; params.v_batch_stride = k_batch;
    params.o_batch_stride = q_batch;
    params.cu_seqlens_q = nullptr; params.cu_seqlens_k = nullptr;
    params.seqused_q = nullptr; params.seqused_k = nullptr;
    params.softmax_lse_ptr = p.lse;
    params.b = x.b; params.h = x.h; params.h_k = x.hk;
    params.seqlen_q = x.sq; params.seqlen_k = x.sk;
    params.seqlen_q_rounded = round_multiple(x.sq, kM);
    params.seqlen_k_rounded = round_multiple(x.sk, kN);
    params.d = x.d; params.d_rounded = dr;
    params.scale_softmax = softmax_scale;
    params.softcap = 0.f;
    params.p_dropout = 1.f;                    // 1 - p_dropout with p_dropout = 0
    params.p_dropout_in_uint8_t = uint8_t(255);
    params.rp_dropout = 1.f;
    // window: mha_bwd passes (-1, 0) if causal else (-1, -1); set_params_fprop then maps -1 -> seqlen - 1
    int wl = -1, wr = causal ? 0 : -1;
    params.is_causal = wl < 0 && wr == 0;
    params.is_local = (wl >= 0 || wr >= 0) && !params.is_causal;
    if (wl < 0) wl = x.sk - 1;
    if (wr < 0) wr = x.sq - 1;
    params.window_size_left = wl; params.window_size_right = wr;
    params.attention_chunk = 0;
    int dev = 0; cudaGetDevice(&dev);
    int major = 9, minor = 0, nsm = 132;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
    params.arch = major * 10 + minor;
    params.num_sm = nsm;                       // sm_margin = 0

    // ---- set_params_dgrad ----
    params.do_ptr = p.dout; params.do_row_stride = q_row; params.do_head_stride = q_head; params.do_batch_stride = q_batch;
    params.dq_ptr = p.dq; params.dk_ptr = p.dk; params.dv_ptr = p.dv;
    params.dq_row_stride = q_row; params.dk_row_stride = k_row; params.dv_row_stride = k_row;
    params.dq_head_stride = q_head; params.dk_head_stride = k_head; params.dv_head_stride = k_head;
    params.dq_batch_stride = q_batch; params.dk_batch_stride = k_batch; params.dv_batch_stride = k_batch;
    params.dq_accum_ptr = p.dq_accum;
    params.dk_accum_ptr = x.hk != x.h ? p.dk_accum : nullptr;
    params.dv_accum_ptr = x.hk != x.h ? p.dv_accum : nullptr;
    params.dsoftmax_sum = p.dsoftmax_sum;
    params.deterministic = false;

    // ---- rest of mha_bwd ----
    params.total_q = x.b * x.sq; params.total_k = x.b * x.sk;
    params.softmax_lse_log2_ptr = p.lse_log2;
    params.dv = x.d; params.dv_rounded = dr;
    params.dq_semaphore = static_cast<int*>(p.dq_semaphore);
    params.dk_semaphore = nullptr; params.dv_semaphore = nullptr;
    params.tile_count_semaphore = nullptr;     // mha_bwd leaves it unset (commented out)
}

}  // namespace fa3bwd
