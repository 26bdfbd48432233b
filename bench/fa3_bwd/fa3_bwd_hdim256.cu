// fa3bwd: hdim 256 instantiations (our own code).
// run_mha_bwd_hdim256, Arch >= 90: <64, 80, 256, ..., 1, 1, false, true, true, 2, 1, 1, 1, false>
#include "fa3bwd_hdim.cuh"
int fa3bwd_run_hdim256(Flash_bwd_params& params, cudaStream_t stream) {
    return fa3bwd::with_mask_and_group(params, [&](auto causal, auto gqa) {
        return fa3bwd::launch<256, 64, 80, decltype(causal)::value, decltype(gqa)::value, 1, 1, false, true, true, 2, 1, 1, 1, false>(params, stream);
    });
}
