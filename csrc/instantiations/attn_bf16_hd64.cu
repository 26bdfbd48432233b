// One (dtype, head dim) per translation unit so that builds compile in parallel and users can
// leave instantiations out (GPROJ_DTYPES / GPROJ_HEADDIMS, see setup.py).
#include "../api/tile_configs.cuh"

namespace gproj {
template void forward_impl<bf16, 64>(const AttnParams&);
template void backward_impl<bf16, 64>(const AttnParams&);
template void center_keys_impl<bf16, 64>(const AttnParams&);
}  // namespace gproj
