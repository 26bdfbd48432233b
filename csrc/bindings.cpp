// pybind11 module gproj_cuda._C: the Python face of the C-style launch API.
//
// Takes plain integers (device addresses, shapes, strides, the stream handle) in a Params
// object; includes no PyTorch header, so the same binary works under any PyTorch version.
// Errors come back as ValueError (bad argument) or RuntimeError (CUDA), with the message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <string>

#include "api/launch.h"

namespace py = pybind11;
using gproj::AttnParams;

namespace {

void raise_on_error(int status, const char* msg) {
  if (status == gproj::kOk) return;
  if (status == gproj::kInvalidArgument) throw py::value_error(msg);
  throw std::runtime_error(msg);
}

// A launch function of the C API as a Python callable: releases the GIL while launching.
template <int (*Launch)(const AttnParams&, char*, size_t)>
void launch(const AttnParams& p) {
  char msg[1024] = {0};
  int st;
  {
    py::gil_scoped_release nogil;
    st = Launch(p, msg, sizeof(msg));
  }
  raise_on_error(st, msg);
}

template <size_t N>
std::array<int64_t, N> get3(const int64_t (&a)[N]) {
  std::array<int64_t, N> r;
  for (size_t i = 0; i < N; ++i) r[i] = a[i];
  return r;
}
template <size_t N>
void set3(int64_t (&a)[N], const std::array<int64_t, N>& v) {
  for (size_t i = 0; i < N; ++i) a[i] = v[i];
}

}  // namespace

#define GPROJ_STRIDE(name)                                                   \
  def_property(#name, [](const AttnParams& p) { return get3(p.name); },      \
               [](AttnParams& p, const std::array<int64_t, 3>& v) { set3(p.name, v); })

PYBIND11_MODULE(_C, m) {
  m.doc() = "gproj_cuda kernels (exact-max forward, GProj backward); see gproj_cuda for the API";
  // module_local: two builds of this module can be loaded side by side (scripts/_timing.py,
  // with_library: A/B of two commits in one process) without their Params types colliding.
  py::class_<AttnParams>(m, "Params", py::module_local())
      .def(py::init<>())
      .def_readwrite("q", &AttnParams::q)
      .def_readwrite("k", &AttnParams::k)
      .def_readwrite("v", &AttnParams::v)
      .def_readwrite("out", &AttnParams::out)
      .def_readwrite("dout", &AttnParams::dout)
      .def_readwrite("dq", &AttnParams::dq)
      .def_readwrite("dk", &AttnParams::dk)
      .def_readwrite("dv", &AttnParams::dv)
      .def_readwrite("dk_accum", &AttnParams::dk_accum)
      .def_readwrite("dk_unprojected", &AttnParams::dk_unprojected)
      .def_readwrite("dk_keysum", &AttnParams::dk_keysum)
      .def_readwrite("dq_accum", &AttnParams::dq_accum)
      .def_readwrite("pk_accum", &AttnParams::pk_accum)
      .def_readwrite("rs_accum", &AttnParams::rs_accum)
      .def_readwrite("dv_accum", &AttnParams::dv_accum)
      .def_readwrite("out_f32", &AttnParams::out_f32)
      .def_readwrite("tile_counter", &AttnParams::tile_counter)
      .def_readwrite("tile_counter_zeroed", &AttnParams::tile_counter_zeroed)
      .def_readwrite("pair_counters", &AttnParams::pair_counters)
      .def_readwrite("kv_head_splits", &AttnParams::kv_head_splits)
      .def_readwrite("dkv_accum", &AttnParams::dkv_accum)
      .def_readwrite("dkv_accum_bytes", &AttnParams::dkv_accum_bytes)
      .def_readwrite("lse", &AttnParams::lse)
      .def_readwrite("stats", &AttnParams::stats)
      .def_readwrite("rowstate", &AttnParams::rowstate)
      .def_readwrite("k_shift", &AttnParams::k_shift)
      .def_readwrite("k_shift_given", &AttnParams::k_shift_given)
      .def_readwrite("center_approx", &AttnParams::center_approx)
      .def_readwrite("k_centered", &AttnParams::k_centered)
      .def_readwrite("k_center_flags", &AttnParams::k_center_flags)
      .def_readwrite("q_centered", &AttnParams::q_centered)
      .def_readwrite("q_center_flags", &AttnParams::q_center_flags)
      .def_readwrite("q_shift", &AttnParams::q_shift)
      .def_readwrite("center_workspace", &AttnParams::center_workspace)
      .def_readwrite("cu_seqlens_q", &AttnParams::cu_seqlens_q)
      .def_readwrite("cu_seqlens_k", &AttnParams::cu_seqlens_k)
      .GPROJ_STRIDE(q_stride)
      .GPROJ_STRIDE(k_stride)
      .GPROJ_STRIDE(v_stride)
      .GPROJ_STRIDE(o_stride)
      .GPROJ_STRIDE(do_stride)
      .GPROJ_STRIDE(dq_stride)
      .GPROJ_STRIDE(dk_stride)
      .GPROJ_STRIDE(dv_stride)
      .GPROJ_STRIDE(kc_stride)
      .GPROJ_STRIDE(qc_stride)
      .def_readwrite("rs_batch_stride", &AttnParams::rs_batch_stride)
      .def_readwrite("rs_head_stride", &AttnParams::rs_head_stride)
      .def_readwrite("batch", &AttnParams::batch)
      .def_readwrite("heads", &AttnParams::heads)
      .def_readwrite("heads_k", &AttnParams::heads_k)
      .def_readwrite("head_dim", &AttnParams::head_dim)
      .def_readwrite("seqlen_q", &AttnParams::seqlen_q)
      .def_readwrite("seqlen_k", &AttnParams::seqlen_k)
      .def_readwrite("total_q", &AttnParams::total_q)
      .def_readwrite("total_k", &AttnParams::total_k)
      .def_readwrite("softmax_scale", &AttnParams::softmax_scale)
      .def_readwrite("window_left", &AttnParams::window_left)
      .def_readwrite("window_right", &AttnParams::window_right)
      .def_readwrite("diag_shift", &AttnParams::diag_shift)
      .def_readwrite("backward_passes", &AttnParams::backward_passes)
      .def_readwrite("partial", &AttnParams::partial)
      .def_readwrite("dtype", &AttnParams::dtype)
      .def_readwrite("numerics", &AttnParams::numerics)
      .def_readwrite("device", &AttnParams::device)
      .def_readwrite("stream", &AttnParams::stream);

  m.def("forward", &launch<gproj::run_forward>,
        "Launch the forward kernel on p.stream (asynchronous).");
  m.def("backward", &launch<gproj::run_backward>,
        "Launch the two backward passes on p.stream (asynchronous).");
  m.def("center_keys", &launch<gproj::run_center_keys>,
        "gproj pre-pass: K' = K - c (exact key centering) and c, on p.stream.");
  m.def("is_compiled", &gproj::is_compiled, py::arg("dtype"), py::arg("head_dim"));
  m.def("compiled_configs", [] { return std::string(gproj::compiled_configs()); });
}
