// gnncompile._C.huge_pages: transparent huge pages for torch's large CPU allocations.
//
// Why: glibc serves an allocation above its mmap threshold (at most 32 MB on 64-bit Linux) with
// a fresh mmap and gives it back with munmap when it is freed, so every large per-step tensor of
// a training step (a 100k x 128 float32 feature matrix is 51 MB) is mapped again and faulted in
// 4 KB page by page on every step: 50,000 minor faults per compiled GCN training step at 100k
// nodes / 1M edges, F = 128 (benchmarks/results/HISTORY.md, section 22, has the measurement).
// Marking the memory MADV_HUGEPAGE lets the kernel fault it in 2 MB at a time.
//
// How: a c10::Allocator that wraps the CPU allocator in place when it is installed. Every
// allocation is the inner allocator's own (its pointer, deleter, context, the profiler's memory
// report); for one of at least `threshold` bytes the whole 2 MB-aligned pages inside it are
// madvise(MADV_HUGEPAGE)d. Nothing outside an allocation is advised, so no huge page is shared
// with other memory and the resident size grows by nothing (the allocation's unaligned ends stay
// in 4 KB pages). torch's own THP_MEM_ALLOC_ENABLE (read once, when torch first allocates) does
// the same by aligning its allocations to 2 MB; this one can be turned on after torch is loaded.
//
// c10::SetAllocator is documented as an initialisation-time call (it is not synchronised with
// allocations on other threads): gnncompile installs the wrapper from the thread that compiles
// a model, before its loader starts threads. Uninstalling puts the inner allocator back; memory
// allocated meanwhile keeps its (the inner allocator's) deleter and stays valid.
#include <pybind11/pybind11.h>

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace py = pybind11;

namespace gnncompile {
namespace {

constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
// The priority SetAllocator is called with: above torch's default registration (0), so that the
// wrapper replaces it, and equal when the inner allocator is put back.
constexpr uint8_t kPriority = 1;

struct HugePageAllocator final : c10::Allocator {
  c10::Allocator* inner = nullptr;
  std::atomic<size_t> threshold{size_t(2) << 20};
  std::atomic<int64_t> advised_calls{0}, advised_bytes{0}, failures{0};
  std::atomic<int> last_errno{0};

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr p = inner->allocate(n);
    if (n >= threshold.load(std::memory_order_relaxed) && p.get() != nullptr) advise(p.get(), n);
    return p;
  }

  void advise(void* ptr, size_t n) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t begin = (a + kHugePage - 1) & ~(kHugePage - 1);
    const uintptr_t end = (a + n) & ~(kHugePage - 1);
    if (end <= begin) return;
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0) {
      advised_calls.fetch_add(1, std::memory_order_relaxed);
      advised_bytes.fetch_add(static_cast<int64_t>(end - begin), std::memory_order_relaxed);
    } else {  // EINVAL where the kernel has no THP: the allocation is good as it is
      failures.fetch_add(1, std::memory_order_relaxed);
      last_errno.store(errno, std::memory_order_relaxed);
    }
  }

  c10::DeleterFnPtr raw_deleter() const override { return inner->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner->copy_data(dest, src, count);
  }
};

HugePageAllocator g_allocator;  // static lifetime, as SetAllocator requires

bool installed() { return c10::GetAllocator(c10::DeviceType::CPU) == &g_allocator; }

// Installs the wrapper (or, when it is installed, sets its threshold). Returns whether it is the
// CPU allocator now: false when another allocator of a higher priority holds the place.
bool install(int64_t threshold) {
  if (threshold < static_cast<int64_t>(kHugePage))
    throw py::value_error("huge_pages: threshold must be >= 2 MiB (" + std::to_string(kHugePage) +
                          " bytes), got " + std::to_string(threshold));
  g_allocator.threshold.store(static_cast<size_t>(threshold));
  if (installed()) return true;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current == nullptr) throw std::runtime_error("huge_pages: torch has no CPU allocator registered");
  g_allocator.inner = current;
  c10::SetAllocator(c10::DeviceType::CPU, &g_allocator, kPriority);
  if (!installed()) {  // a higher-priority allocator is registered: leave it alone
    g_allocator.inner = nullptr;
    return false;
  }
  return true;
}

// Puts the inner allocator back. Returns whether the wrapper was installed.
bool uninstall() {
  if (!installed()) return false;
  c10::SetAllocator(c10::DeviceType::CPU, g_allocator.inner, kPriority);
  return true;
}

py::dict state() {
  py::dict d;
  d["installed"] = installed();
  d["threshold"] = static_cast<int64_t>(g_allocator.threshold.load());
  d["advised_calls"] = g_allocator.advised_calls.load();
  d["advised_bytes"] = g_allocator.advised_bytes.load();
  d["failures"] = g_allocator.failures.load();
  const int e = g_allocator.last_errno.load();
  d["last_error"] = e == 0 ? std::string() : std::string(std::strerror(e));
  return d;
}

}  // namespace

void bind_huge_pages(py::module_& m) {
  py::module_ h = m.def_submodule("huge_pages", "madvise(MADV_HUGEPAGE) for torch's large CPU allocations");
  h.def("install", &install, py::arg("threshold"),
        "Wrap torch's CPU allocator (or set the wrapper's threshold in bytes, >= 2 MiB); "
        "returns whether the wrapper is the CPU allocator now");
  h.def("uninstall", &uninstall, "Put the wrapped allocator back; returns whether the wrapper was installed");
  h.def("state", &state, "{installed, threshold, advised_calls, advised_bytes, failures, last_error}");
  h.attr("HUGE_PAGE_BYTES") = static_cast<int64_t>(kHugePage);
}

}  // namespace gnncompile
