// gnncompile._C.launch_rule: the CUDA kernels' launch rule (../cuda/knobs.h, plain host C++)
// for Python, in every build of the extension, the CPU-only one too. Nothing here decides a
// knob: each function checks its arguments, calls the function of knobs.h that the CUDA glue
// calls at launch, with the arguments the glue derives from its tensors (C = F / heads, the
// accumulator of the element type, an arg slot for max / min), and returns the knobs in their
// layout order. gnncompile/hardware/cuda_knobs.py wraps it.
//
// Device properties come as a dict {sm_count, l2_bytes, cc_major, cc_minor, max_threads_per_sm}
// of ints, as cudaDeviceGetAttribute reports them (glue.h reads them so): sm_count is required
// and >= 1, the others are >= 0 and default to 0 (unknown: no L2 bound, threads per SM from the
// compute capability). Bad arguments raise ValueError or TypeError naming the argument.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "../cuda/knobs.h"
#include "macros.h"

namespace py = pybind11;

namespace gnncompile {
namespace {

using gpu::DeviceProps;
using gpu::LaunchKnobs;

// An int (or an object with __index__, not a bool) as int64; `what` names it in the error.
int64_t to_int(py::handle v, const std::string& what) {
  if (PyBool_Check(v.ptr()) || !PyIndex_Check(v.ptr())) {
    throw py::type_error(what + " must be an int, got " + std::string(py::str(py::type::of(v).attr("__name__"))));
  }
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) throw py::value_error(what + " = " + std::string(py::repr(v)) + " does not fit in int64");
  if (x == -1 && PyErr_Occurred()) throw py::error_already_set();
  return x;
}

int64_t in_range(int64_t v, int64_t lo, int64_t hi, const std::string& what) {
  if (v < lo || v > hi) {
    throw py::value_error(what + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                          std::to_string(v));
  }
  return v;
}

DeviceProps to_props(const py::dict& props) {
  DeviceProps d;
  bool has_sm_count = false;
  for (const auto& item : props) {
    if (!py::isinstance<py::str>(item.first)) {
      throw py::type_error("props: keys must be str, got " + std::string(py::repr(item.first)));
    }
    const std::string key = item.first.cast<std::string>();
    const std::string what = "props['" + key + "']";
    if (key == "sm_count") {
      d.sm_count = static_cast<int>(in_range(to_int(item.second, what), 1, INT_MAX, what));
      has_sm_count = true;
    } else if (key == "l2_bytes") {
      d.l2_bytes = in_range(to_int(item.second, what), 0, INT_MAX, what);
    } else if (key == "cc_major") {
      d.cc_major = static_cast<int>(in_range(to_int(item.second, what), 0, INT_MAX, what));
    } else if (key == "cc_minor") {
      d.cc_minor = static_cast<int>(in_range(to_int(item.second, what), 0, INT_MAX, what));
    } else if (key == "max_threads_per_sm") {
      d.max_threads_per_sm = static_cast<int>(in_range(to_int(item.second, what), 0, INT_MAX, what));
    } else {
      throw py::value_error("props: unknown key '" + key +
                            "' (expected sm_count, l2_bytes, cc_major, cc_minor, max_threads_per_sm)");
    }
  }
  if (!has_sm_count) throw py::value_error("props: sm_count is required (the number of SMs, >= 1)");
  return d;
}

struct Sizes {
  int64_t M, E, F, C;
};

// M, E, F >= 0, heads >= 1 dividing F, and sizes the rule's int64 arithmetic holds.
Sizes to_sizes(int64_t M, int64_t E, int64_t F, int64_t heads, const char* width_name) {
  if (M < 0) throw py::value_error("num_rows must be >= 0, got " + std::to_string(M));
  if (E < 0) throw py::value_error("num_edges must be >= 0, got " + std::to_string(E));
  if (F < 0) throw py::value_error(std::string(width_name) + " must be >= 0, got " + std::to_string(F));
  if (heads < 1) throw py::value_error("heads must be >= 1, got " + std::to_string(heads));
  if (F % heads != 0) {
    throw py::value_error(std::string(width_name) + " = " + std::to_string(F) + " is not a multiple of heads = " +
                          std::to_string(heads));
  }
  if (!gpu::sizes_fit_rule(M, E, F)) {
    throw py::value_error("num_rows = " + std::to_string(M) + ", num_edges = " + std::to_string(E) + ", " +
                          width_name + " = " + std::to_string(F) +
                          ": too large for the launch rule's int64 arithmetic (no device holds such a graph)");
  }
  return {M, E, F, F / heads};
}

int check_elem_bytes(int64_t b) {
  if (b != 2 && b != 4 && b != 8) {
    throw py::value_error("elem_bytes must be 2, 4 or 8 (the kernels' element sizes), got " + std::to_string(b));
  }
  return static_cast<int>(b);
}

int64_t check_align(int64_t a) {
  if (a < 1 || (a & (a - 1)) != 0) {
    throw py::value_error("align_bytes must be a power of two >= 1, got " + std::to_string(a));
  }
  return a;
}

std::vector<int64_t> layout(const LaunchKnobs& k) {
  std::vector<int64_t> out(gpu::kNumKnobs);
  out[gpu::kLanesKnob] = k.lanes;
  out[gpu::kRowsPerBlockKnob] = k.rows_per_block;
  out[gpu::kVecKnob] = k.vec;
  out[gpu::kItemsKnob] = k.items;
  return out;
}

std::vector<int64_t> spmm(const py::dict& props, int64_t M, int64_t E, int64_t F, int64_t heads,
                          int64_t elem_bytes, const std::string& reduce, int64_t align_bytes,
                          const std::vector<int64_t>& knobs) {
  const DeviceProps d = to_props(props);
  const Sizes s = to_sizes(M, E, F, heads, "num_features");
  if (F > gpu::kMaxSpmmFeatures) {
    throw py::value_error("num_features = " + std::to_string(F) + " is more than the CUDA spmm supports (" +
                          std::to_string(gpu::kMaxSpmmFeatures) + ")");
  }
  const int eb = check_elem_bytes(elem_bytes);
  Reduce r = Reduce::Sum;
  if (!reduce_from_name(reduce, r)) {
    throw py::value_error("unknown reduce '" + reduce + "' (expected sum, mean, max or min)");
  }
  return layout(gpu::spmm_knobs(d, knobs.data(), static_cast<int64_t>(knobs.size()), s.M, s.E, s.F, s.C, eb,
                                gpu::acc_bytes_for(eb), reduce_keeps_arg(r), check_align(align_bytes)));
}

std::vector<int64_t> edge_dot(const py::dict& props, int64_t M, int64_t E, int64_t F, int64_t heads,
                              int64_t elem_bytes, int64_t align_bytes, const std::vector<int64_t>& knobs) {
  const DeviceProps d = to_props(props);
  const Sizes s = to_sizes(M, E, F, heads, "num_features");
  const int eb = check_elem_bytes(elem_bytes);
  return layout(gpu::edge_dot_knobs(d, knobs.data(), static_cast<int64_t>(knobs.size()), s.M, s.E, s.F, s.C, eb,
                                    check_align(align_bytes)));
}

std::vector<int64_t> edge_softmax(const py::dict& props, int64_t M, int64_t E, int64_t heads, int64_t elem_bytes,
                                  const std::vector<int64_t>& knobs) {
  if (heads < 1) throw py::value_error("heads must be >= 1, got " + std::to_string(heads));
  const DeviceProps d = to_props(props);
  const Sizes s = to_sizes(M, E, heads, 1, "heads");
  const int eb = check_elem_bytes(elem_bytes);
  return layout(gpu::edge_softmax_knobs(d, knobs.data(), static_cast<int64_t>(knobs.size()), s.M, s.E, s.F,
                                        gpu::acc_bytes_for(eb)));
}

}  // namespace

void bind_launch_rule(py::module_& parent) {
  py::module_ m = parent.def_submodule(
      "launch_rule",
      "The CUDA kernels' launch rule (native/cuda/knobs.h): the knobs [lanes_per_row, rows_per_block, "
      "vec_width, items_per_group] a kernel launches with for a device, a graph and the explicit knobs "
      "(0 or missing = the default). Available in every build; needs no GPU.");

  py::tuple names(static_cast<size_t>(gpu::kNumKnobs)), maxima(static_cast<size_t>(gpu::kNumKnobs));
  for (int i = 0; i < gpu::kNumKnobs; ++i) {
    names[i] = py::str(gpu::kKnobNames[i]);
    maxima[i] = py::int_(gpu::kExplicitKnobMax[i]);
  }
  m.attr("KNOB_NAMES") = names;
  m.attr("EXPLICIT_KNOB_MAX") = maxima;
  m.attr("MAX_LANES") = gpu::kMaxLanes;
  m.attr("MAX_BLOCK") = gpu::kMaxBlock;
  m.attr("MAX_VEC") = gpu::kMaxExplicitVec;
  m.attr("MIN_ITEMS") = gpu::kMinItems;
  m.attr("MAX_ITEMS") = gpu::kMaxItems;
  m.attr("MAX_EXPLICIT_ITEMS") = gpu::kMaxExplicitItems;
  m.attr("WAVES") = gpu::kWaves;
  m.attr("MAX_GRID_Y") = gpu::kMaxGridY;
  m.attr("MAX_SPMM_FEATURES") = gpu::kMaxSpmmFeatures;
  m.attr("SCRATCH_FLOOR_BYTES") = gpu::kScratchFloorBytes;
  py::dict widths;
  for (const int eb : {2, 4, 8}) {
    py::list w;
    for (int i = 0; i < 3; ++i) {
      const int v = gpu::compiled_vec(eb, i);
      if (i == 0 || v != gpu::compiled_vec(eb, i - 1)) w.append(v);
    }
    widths[py::int_(eb)] = py::tuple(w);
  }
  m.attr("COMPILED_VEC") = widths;

  m.def(
      "threads_per_sm", [](const py::dict& props) { return gpu::threads_per_sm(to_props(props)); }, py::arg("props"),
      "Threads per SM the rule assumes: max_threads_per_sm when > 0, else from the compute capability.");
  m.def(
      "block_threads", [](const py::dict& props) { return gpu::block_threads(to_props(props)); }, py::arg("props"),
      "Threads per block of the default layout: min(256, threads_per_sm / 4).");
  m.def("spmm_knobs", &spmm, py::arg("props"), py::arg("num_rows"), py::arg("num_edges"), py::arg("num_features"),
        py::kw_only(), py::arg("heads") = 1, py::arg("elem_bytes") = 4, py::arg("reduce") = "sum",
        py::arg("align_bytes") = 16, py::arg("knobs") = std::vector<int64_t>{},
        "The knobs spmm launches with: num_features = F per node (heads weight columns of F / heads), "
        "elem_bytes of x (2, 4 or 8), reduce (max / min keep an arg slot per feature), align_bytes = the "
        "largest power of two dividing the addresses of x and out (at most 16 matters).");
  m.def("edge_dot_knobs", &edge_dot, py::arg("props"), py::arg("num_rows"), py::arg("num_edges"),
        py::arg("num_features"), py::kw_only(), py::arg("heads") = 1, py::arg("elem_bytes") = 4,
        py::arg("align_bytes") = 16, py::arg("knobs") = std::vector<int64_t>{},
        "The knobs edge_dot launches with (no scratch: an explicit items_per_group is kept from 1 up).");
  m.def("edge_softmax_knobs", &edge_softmax, py::arg("props"), py::arg("num_rows"), py::arg("num_edges"),
        py::arg("heads"), py::kw_only(), py::arg("elem_bytes") = 4, py::arg("knobs") = std::vector<int64_t>{},
        "The knobs edge_softmax and its backward launch with (one warp per group: only items_per_group "
        "is a knob).");
}

}  // namespace gnncompile
