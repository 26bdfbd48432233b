// One (dtype, head dim) per translation unit so that builds compile in parallel and users can
// leave instantiations out (GPROJ_DTYPES / GPROJ_HEADDIMS, see setup.py).
// The forward's 176-key tiles (GPROJ_FWD_VARIANT=4) need WGMMA N = 176, which CuTe's operand
// selectors offer only with this macro; without it 176 falls back to N = 16 (bench/NOTES.md,
// "Why 176-key tiles were slow"). The other d = 128 GEMMs use N = 8, 64 and 128, which it
// leaves as they are (same ptxas output).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../api/tile_configs.cuh"

namespace gproj {
template void forward_impl<bf16, 128>(const AttnParams&);
template void backward_impl<bf16, 128>(const AttnParams&);
template void center_keys_impl<bf16, 128>(const AttnParams&);
}  // namespace gproj
