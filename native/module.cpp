// The Python extension gnncompile._C. Loading it runs the TORCH_LIBRARY_IMPL registrations of
// every kernel file linked into it; the module itself reports how it was built and holds the
// submodules launch_rule, the CUDA kernels' launch rule (common/launch_rule.cpp), and huge_pages,
// transparent huge pages for torch's large CPU allocations (common/huge_pages.cpp), and codegen,
// the registry of generated message kernels (cpu/message_codegen.cpp).
#include <pybind11/pybind11.h>

#include <cstdint>

namespace gnncompile {
void bind_launch_rule(pybind11::module_& m);
void bind_huge_pages(pybind11::module_& m);  // common/huge_pages.cpp
void bind_codegen(pybind11::module_& m);  // cpu/message_codegen.cpp
int64_t structure_validations();  // common/trust.h
}

#ifndef GNNCOMPILE_WITH_CUDA
#define GNNCOMPILE_WITH_CUDA 0
#endif
#ifndef GNNCOMPILE_CUDA_ARCHS
#define GNNCOMPILE_CUDA_ARCHS ""
#endif
#ifndef GNNCOMPILE_CXX_FLAGS
#define GNNCOMPILE_CXX_FLAGS ""
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "gnncompile native kernels (CPU, and CUDA when built with it)";
  m.def("cuda_kernels", [] { return static_cast<bool>(GNNCOMPILE_WITH_CUDA); },
        "True when the CUDA kernels were compiled into this module");
  m.def("build_info", [] {
    pybind11::dict d;
    d["cuda"] = static_cast<bool>(GNNCOMPILE_WITH_CUDA);
    d["cuda_archs"] = GNNCOMPILE_CUDA_ARCHS;
    d["cxx_flags"] = GNNCOMPILE_CXX_FLAGS;
    d["compiler"] = __VERSION__;
    return d;
  });
  m.def("structure_validations", &gnncompile::structure_validations,
        "Structure validations run by the native code in this process (common/trust.h)");
  gnncompile::bind_launch_rule(m);
  gnncompile::bind_huge_pages(m);
  gnncompile::bind_codegen(m);
}
