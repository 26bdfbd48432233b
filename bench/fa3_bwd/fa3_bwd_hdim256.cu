// fa3bwd: hdim 256 instantiations (our own code).
// run_mha_bwd_hdim256, Arch >= 90: <64, 80, 256, ..., 1, 1, false, true, true, 2, 1, 1, 1, false>
#include "fa3bwd_hdim.cuh"
int fa3bwd_run_hdim256(Flash_bwd_params& params, cudaStream_t stream) {
    bool const gqa = params.h != params.h_k;
    if (params.is_causal) {
        if (!gqa) return fa3bwd::launch<256, 64, 80, true, false, 1, 1, false, true, true, 2, 1, 1, 1, false>(params, stream);
#if FA3BWD_GQA
        return fa3bwd::launch<256, 64, 80, true, true, 1, 1, false, true, true, 2, 1, 1, 1, false>(params, stream);
#endif
    } else {
        if (!gqa) return fa3bwd::launch<256, 64, 80, false, false, 1, 1, false, true, true, 2, 1, 1, 1, false>(params, stream);
#if FA3BWD_GQA
        return fa3bwd::launch<256, 64, 80, false, true, 1, 1, false, true, true, 2, 1, 1, 1, false>(params, stream);
#endif
    }
    return int(cudaErrorNotSupported);
}
