// One (dtype, head dim) per translation unit so that builds compile in parallel and users can
// leave instantiations out (GPROJ_DTYPES / GPROJ_HEADDIMS, see setup.py).
// WGMMA N = 80 (the forward's variant 6, FlashAttention-3's d = 256 key tile) exists in CuTe's
// operand selectors only with this macro; without it N = 80 falls back to N = 16 (bench/NOTES.md
// session 15 item 9). The other d = 256 GEMMs use N in {32, 64, 128, 256}, which it leaves alone.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../api/tile_configs.cuh"

namespace gproj {
template void forward_impl<bf16, 256>(const AttnParams&);
template void backward_impl<bf16, 256>(const AttnParams&);
template void center_keys_impl<bf16, 256>(const AttnParams&);
}  // namespace gproj
