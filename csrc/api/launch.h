// C-style launch API: a params struct in, a status code and message out. The pybind11 module
// (bindings.cpp) is a thin layer over these four functions; nothing here depends on PyTorch.
#pragma once
#include <cstddef>
#include "params.h"

namespace gproj {

enum Status : int { kOk = 0, kInvalidArgument = 1, kCudaError = 2, kNotCompiled = 3 };

// Forward: writes out, lse, stats. Keys must already be centered in gproj mode (k_shift set).
int run_forward(const AttnParams& p, char* err, size_t err_len);
// Backward: dQ pass (writes dq, rowstate) then dK/dV pass (writes dk, dv, optional dk_accum);
// p.backward_passes selects the passes, p.partial makes them add fp32 partials (params.h).
int run_backward(const AttnParams& p, char* err, size_t err_len);
// gproj pre-pass: exact key centering, writes k_centered and k_shift (uses center_workspace).
int run_center_keys(const AttnParams& p, char* err, size_t err_len);
// Whether (dtype, head_dim) was compiled into this build.
bool is_compiled(int dtype, int head_dim);
// Head dims / dtypes compiled in, as text ("bf16:64,bf16:128,...").
const char* compiled_configs();

}  // namespace gproj
