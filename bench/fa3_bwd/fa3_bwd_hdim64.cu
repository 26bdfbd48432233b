// fa3bwd: hdim 64 instantiations (our own code).
// run_mha_bwd_hdim64, Arch >= 90, no softcap: <128, 128, 64, ..., 2, 2, true, false, false, 2, 1, 2, 2, false>
#include "fa3bwd_hdim.cuh"
int fa3bwd_run_hdim64(Flash_bwd_params& params, cudaStream_t stream) {
    return fa3bwd::with_mask_and_group(params, [&](auto causal, auto gqa) {
        return fa3bwd::launch<64, 128, 128, decltype(causal)::value, decltype(gqa)::value, 2, 2, true, false, false, 2, 1, 2, 2, false>(params, stream);
    });
}
