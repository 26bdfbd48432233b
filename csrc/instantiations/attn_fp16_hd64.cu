// One (dtype, head dim) per translation unit so that builds compile in parallel and users can
// leave instantiations out (GPROJ_DTYPES / GPROJ_HEADDIMS, see setup.py).
// WGMMA N = 160 (the forward's variant 7) exists in CuTe's selectors only with this macro; the
// d = 64 kernels' other GEMMs use N in {8, 16, 32, 64, 96, 128, 192}, which it leaves alone.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include "../api/tile_configs.cuh"

namespace gproj {
template void forward_impl<fp16, 64>(const AttnParams&);
template void backward_impl<fp16, 64>(const AttnParams&);
template void center_keys_impl<fp16, 64>(const AttnParams&);
}  // namespace gproj
