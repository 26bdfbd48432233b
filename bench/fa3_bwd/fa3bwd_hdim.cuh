// fa3bwd: per-hdim instantiation helper (our own code). Calls FA3's run_flash_bwd directly with the
// template arguments that FA3's run_mha_bwd_hdim{64,128,256} pick for Arch >= 90, bf16, no softcap,
// not local, not varlen, not deterministic (see hopper/flash_bwd_launch_template.h).
#pragma once
#include <type_traits>

#include "fa3bwd_common.h"
#include "flash_bwd_launch_template.h"

#ifndef FA3BWD_GQA
#define FA3BWD_GQA 0   // build with -DFA3BWD_GQA=1 to also instantiate the GQA/MQA (h != h_k) variants
#endif

namespace fa3bwd {

template <int kHeadDim, int kBlockM, int kBlockN, bool Is_causal, bool GQA,
          int Stages_dO, int Stages_dS, bool SdP_swapAB, bool dKV_swapAB, bool dQ_swapAB,
          int NumMmaWarpGroups, int AtomLayoutMSdP, int AtomLayoutNdKV, int AtomLayoutMdQ, bool V_in_regs>
inline int launch(Flash_bwd_params& params, cudaStream_t stream) {
    run_flash_bwd</*Arch=*/90, kHeadDim, kBlockM, kBlockN, cutlass::bfloat16_t,
                  Is_causal, /*Is_local=*/false, /*Has_softcap=*/false, /*Varlen=*/false, /*Deterministic=*/false, GQA,
                  Stages_dO, Stages_dS, SdP_swapAB, dKV_swapAB, dQ_swapAB,
                  NumMmaWarpGroups, AtomLayoutMSdP, AtomLayoutNdKV, AtomLayoutMdQ, V_in_regs>(params, stream);
    return int(cudaGetLastError());
}

// Calls f(causal, gqa) with the call's mask and GQA flags as std::integral_constant<bool>, so that
// each per-hdim dispatcher states only its template arguments (the GQA forms only with
// FA3BWD_GQA; without it a GQA call returns cudaErrorNotSupported).
template <class F>
inline int with_mask_and_group(Flash_bwd_params& params, F&& f) {
    auto by_group = [&](auto causal) {
        if (params.h == params.h_k) return f(causal, std::false_type{});
#if FA3BWD_GQA
        return f(causal, std::true_type{});
#else
        return int(cudaErrorNotSupported);
#endif
    };
    return params.is_causal ? by_group(std::true_type{}) : by_group(std::false_type{});
}

}  // namespace fa3bwd
