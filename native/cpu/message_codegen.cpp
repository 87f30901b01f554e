// The registry of generated message kernels (message_codegen.h) and its Python binding,
// gnncompile._C.codegen: register(key, address), unregister_all(), keys(), calls(), and the key
// functions (key, reduce_op, multi_op, edges_op) for tests.
#include "message_codegen.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace gnncompile {
namespace cpu {
namespace {

std::shared_mutex g_mutex;
std::unordered_map<std::string, GenRowsFn>& registry() {
  static std::unordered_map<std::string, GenRowsFn> r;
  return r;
}
std::atomic<bool> g_any{false};
std::atomic<int64_t> g_calls{0};

}  // namespace

std::string reduce_op_key(int reduce) { return "r" + std::to_string(reduce); }

std::string multi_op_key(c10::IntArrayRef results) {
  std::string k = "m";
  for (size_t i = 0; i < results.size(); ++i) {
    if (i) k += '.';
    k += std::to_string(results[i]);
  }
  return k;
}

std::string edges_op_key(bool by_slot, int64_t out_width, int64_t F) {
  return std::string("e") + (by_slot ? '1' : '0') + (out_width == F ? 'f' : 'g');
}

std::string encoder_grad_op_key(int64_t enc, bool need_features, int64_t W, int64_t F) {
  return "n" + std::to_string(enc) + "." + (need_features ? "1" : "0") + (W == F ? "f" : "g");
}

std::string codegen_key(const std::string& op, bool f64, bool i64, c10::IntArrayRef code,
                        c10::ArrayRef<double> consts, c10::IntArrayRef sides, const std::vector<int64_t>& widths,
                        int64_t F) {
  std::string k = "v" + std::to_string(kCodegenAbi) + "|" + op + (f64 ? "|f64" : "|f32") + (i64 ? "|i64" : "|i32") +
                  "|c";
  char buf[32];
  for (size_t i = 0; i < code.size(); ++i) {
    if (i) k += ',';
    k += std::to_string(code[i]);
  }
  k += "|k";
  for (size_t i = 0; i < consts.size(); ++i) {
    uint64_t bits;
    std::memcpy(&bits, &consts[i], sizeof(bits));
    std::snprintf(buf, sizeof(buf), "%s%016" PRIx64, i ? "," : "", bits);
    k += buf;
  }
  k += "|i";
  for (size_t i = 0; i < sides.size(); ++i) {
    if (i) k += ',';
    k += std::to_string(sides[i]);
    // an edge encoder (side 5, or 6: its features stored per CSR slot): the class of its
    // output's width (Wt's, input i + 1) and its D
    const bool enc = (sides[i] == 5 || sides[i] == 6) && i + 1 < widths.size();
    const int64_t w = enc ? widths[i + 1] : widths[i];
    k += w == F ? 'f' : (w == 1 ? 's' : 'g');
    if (enc) k += "d" + std::to_string(widths[i]);
  }
  return k;
}

bool any_generated() { return g_any.load(std::memory_order_acquire); }

GenRowsFn find_generated(const std::string& key) {
  std::shared_lock<std::shared_mutex> lock(g_mutex);
  auto it = registry().find(key);
  return it == registry().end() ? nullptr : it->second;
}

void count_generated_call() { g_calls.fetch_add(1, std::memory_order_relaxed); }

}  // namespace cpu

// gnncompile._C.codegen. A registered address must stay valid for the life of the process: the
// Python side never unloads a kernel library it has registered.
void bind_codegen(pybind11::module_& parent) {
  namespace py = pybind11;
  auto m = parent.def_submodule("codegen", "generated message kernels (gnncompile/codegen)");
  m.attr("ABI") = cpu::kCodegenAbi;
  m.def("register", [](const std::string& key, uintptr_t address) {
    std::unique_lock<std::shared_mutex> lock(cpu::g_mutex);
    cpu::registry()[key] = reinterpret_cast<cpu::GenRowsFn>(address);
    cpu::g_any.store(true, std::memory_order_release);
  }, py::arg("key"), py::arg("address"), "Run the kernel at `address` for the message op calls of `key`");
  m.def("unregister_all", [] {
    std::unique_lock<std::shared_mutex> lock(cpu::g_mutex);
    cpu::registry().clear();
    cpu::g_any.store(false, std::memory_order_release);
  }, "Every message op call runs the interpreter again");
  m.def("keys", [] {
    std::shared_lock<std::shared_mutex> lock(cpu::g_mutex);
    std::vector<std::string> out;
    for (const auto& kv : cpu::registry()) out.push_back(kv.first);
    return out;
  });
  m.def("calls", [] { return cpu::g_calls.load(); }, "message op calls that ran a generated kernel");
  m.def("key", [](const std::string& op, bool f64, bool i64, std::vector<int64_t> code, std::vector<double> consts,
                  std::vector<int64_t> sides, std::vector<int64_t> widths, int64_t F) {
    return cpu::codegen_key(op, f64, i64, code, consts, sides, widths, F);
  }, "The registry key of a call (tests compare it with gnncompile.codegen's)");
  m.def("reduce_op", [](int reduce) { return cpu::reduce_op_key(reduce); });
  m.def("multi_op", [](std::vector<int64_t> results) { return cpu::multi_op_key(results); });
  m.def("edges_op", [](bool by_slot, int64_t out_width, int64_t F) { return cpu::edges_op_key(by_slot, out_width, F); });
  m.def("encoder_grad_op", [](int64_t enc, bool need_features, int64_t W, int64_t F) {
    return cpu::encoder_grad_op_key(enc, need_features, W, F);
  });
}

}  // namespace gnncompile
