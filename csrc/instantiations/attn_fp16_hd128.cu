// One (dtype, head dim) per translation unit so that builds compile in parallel and users can
// leave instantiations out (GPROJ_DTYPES / GPROJ_HEADDIMS, see setup.py).
#include "../api/tile_configs.cuh"

namespace gproj {
template void forward_impl<fp16, 128>(const AttnParams&);
template void backward_impl<fp16, 128>(const AttnParams&);
template void center_keys_impl<fp16, 128>(const AttnParams&);
}  // namespace gproj
