// fa3bwd: hdim 64 instantiations (our own code).
// run_mha_bwd_hdim64, Arch >= 90, no softcap: <128, 128, 64, ..., 2, 2, true, false, false, 2, 1, 2, 2, false>
#include "fa3bwd_hdim.cuh"
int fa3bwd_run_hdim64(Flash_bwd_params& params, cudaStream_t stream) {
    bool const gqa = params.h != params.h_k;
    if (params.is_causal) {
        if (!gqa) return fa3bwd::launch<64, 128, 128, true, false, 2, 2, true, false, false, 2, 1, 2, 2, false>(params, stream);
#if FA3BWD_GQA
        return fa3bwd::launch<64, 128, 128, true, true, 2, 2, true, false, false, 2, 1, 2, 2, false>(params, stream);
#endif
    } else {
        if (!gqa) return fa3bwd::launch<64, 128, 128, false, false, 2, 2, true, false, false, 2, 1, 2, 2, false>(params, stream);
#if FA3BWD_GQA
        return fa3bwd::launch<64, 128, 128, false, true, 2, 2, true, false, false, 2, 1, 2, 2, false>(params, stream);
#endif
    }
    return int(cudaErrorNotSupported);
}
