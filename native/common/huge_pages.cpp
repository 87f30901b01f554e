// gnncompile._C.huge_pages: torch's CPU allocator wrapped for large per-step allocations:
// transparent huge pages, and a capped cache of freed large blocks for reuse.
//
// Why: glibc serves an allocation above its mmap threshold (at most 32 MB on 64-bit Linux) with
// a fresh mmap and gives it back with munmap when it is freed, so every large per-step tensor of
// a training step (a 100k x 128 float32 feature matrix is 51 MB) is mapped again and faulted in
// 4 KB page by page on every step: 50,000 minor faults per compiled GCN training step at 100k
// nodes / 1M edges, F = 128 (benchmarks/results/HISTORY.md, section 22, has the measurement).
// Marking the memory MADV_HUGEPAGE lets the kernel fault it in 2 MB at a time; the kernel still
// zeroes every page of a fresh mapping, and maps and unmaps it, on every step. The block cache
// takes that away too: a freed allocation of at least `cache_min` bytes is kept (up to `cache_cap`
// idle bytes, oldest evicted first; a block unused for `max_idle_s` is freed at the next miss or
// free) and handed out again for a later request of the same size (a block of up to 1/8 more
// bytes serves it), already faulted in.
//
// How: a c10::Allocator that wraps the CPU allocator in place when it is installed. With the cache
// off every allocation is the inner allocator's own (its pointer, deleter, context, the profiler's
// memory report); for one of at least `threshold` bytes the whole 2 MB-aligned pages inside it are
// madvise(MADV_HUGEPAGE)d when huge pages are on. Nothing outside an allocation is advised, so no
// huge page is shared with other memory and the resident size grows by nothing (the allocation's
// unaligned ends stay in 4 KB pages). torch's own THP_MEM_ALLOC_ENABLE (read once, when torch
// first allocates) does the same by aligning its allocations to 2 MB; this one can be turned on
// after torch is loaded.
//
// The cache never hands out memory that anything still uses: a block enters it only from its
// DataPtr's deleter, which torch calls when the last storage holding it is gone (views, autograd's
// saved tensors and numpy arrays over a tensor all hold the storage). Like torch.empty's memory, a
// reused block holds old values; every kernel writes its outputs before reading them (the tests
// compare whole training runs with the cache on and off bit for bit). A cached block's DataPtr has
// its pointer as context and this file's deleter (so raw_allocate / raw_deallocate keep working);
// the inner DataPtr that owns the memory is kept with the block and freed when the block is
// evicted, when the cache is emptied or turned off, or when it comes back while the cache is off.
// The profiler's memory report counts a cached block as allocated until the inner allocator frees
// it.
//
// c10::SetAllocator is documented as an initialisation-time call (it is not synchronised with
// allocations on other threads): gnncompile installs the wrapper from the thread that compiles
// a model, before its loader starts threads. Uninstalling puts the inner allocator back and
// empties the cache; memory allocated meanwhile keeps its deleter and stays valid. The cache's
// lock is taken around fork() (pthread_atfork), so a forked loader worker never inherits it held.
#include <pybind11/pybind11.h>

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace py = pybind11;

namespace gnncompile {
namespace {

constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
// The priority SetAllocator is called with: above torch's default registration (0), so that the
// wrapper replaces it, and equal when the inner allocator is put back.
constexpr uint8_t kPriority = 1;
// The smallest cache_min: below a page a cache would only duplicate malloc's own free lists.
constexpr int64_t kMinCacheBlock = 4096;

// One large allocation handed out through the cache path: the inner allocator's DataPtr (the owner
// of the memory), its size in bytes and, while idle, when it was freed (an order for oldest-first
// eviction, and a time for the expiry of blocks idle too long).
struct Block {
  c10::DataPtr inner;
  size_t capacity = 0;
  uint64_t stamp = 0;
  std::chrono::steady_clock::time_point freed{};
};

// The block cache. Heap-allocated and never destroyed: a tensor freed by another static
// destructor at exit must still find it.
struct BlockCache {
  std::mutex mu;
  std::atomic<size_t> cap{0};               // idle bytes kept at most; 0: the cache is off
  std::atomic<size_t> min_bytes{size_t(2) << 20};
  // an idle block unused for longer than this is freed at the cache's next event (a block a
  // step no longer asks for, e.g. of a form the speed guard dropped, is not kept up to the cap)
  std::atomic<int64_t> max_idle_us{30'000'000};
  size_t held = 0, held_peak = 0;           // idle bytes now, and the most ever
  uint64_t clock = 0;
  std::unordered_map<void*, Block*> live;   // handed out, by pointer
  std::multimap<size_t, Block*> idle;       // kept for reuse, by capacity
  int64_t hits = 0, misses = 0, evictions = 0, expired = 0, released = 0;
  c10::DeleterFnPtr inner_raw = nullptr;    // the inner allocator's raw deleter (raw_deallocate)
};

BlockCache& cache() {
  static BlockCache* c = new BlockCache();
  return *c;
}

void release_block(void* ptr);
void expire_locked(BlockCache& c, std::vector<Block*>& out);
void free_blocks(const std::vector<Block*>& blocks);

struct HugePageAllocator final : c10::Allocator {
  c10::Allocator* inner = nullptr;
  std::atomic<bool> advise_on{false};
  std::atomic<size_t> threshold{size_t(2) << 20};
  std::atomic<int64_t> advised_calls{0}, advised_bytes{0}, failures{0};
  std::atomic<int> last_errno{0};

  c10::DataPtr allocate(size_t n) override {
    BlockCache& c = cache();
    if (n > 0 && c.cap.load(std::memory_order_relaxed) > 0 && n >= c.min_bytes.load(std::memory_order_relaxed))
      return allocate_cached(c, n);
    c10::DataPtr p = inner->allocate(n);
    maybe_advise(p.get(), n);
    return p;
  }

  c10::DataPtr allocate_cached(BlockCache& c, size_t n) {
    const c10::Device cpu(c10::DeviceType::CPU);
    std::vector<Block*> stale;
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.idle.lower_bound(n);
      if (it != c.idle.end() && it->first - n <= n / 8) {  // the smallest idle block that fits
        Block* b = it->second;
        c.idle.erase(it);
        c.held -= b->capacity;
        void* ptr = b->inner.get();
        c.live.emplace(ptr, b);
        ++c.hits;
        return c10::DataPtr(ptr, ptr, &release_block, cpu);
      }
      ++c.misses;
      expire_locked(c, stale);
    }
    free_blocks(stale);
    c10::DataPtr p = inner->allocate(n);
    void* ptr = p.get();
    if (ptr == nullptr) return p;
    maybe_advise(ptr, n);
    Block* b = new Block{std::move(p), n, 0};
    {
      std::lock_guard<std::mutex> lock(c.mu);
      c.live.emplace(ptr, b);
    }
    return c10::DataPtr(ptr, ptr, &release_block, cpu);
  }

  void maybe_advise(void* ptr, size_t n) {
    if (ptr != nullptr && advise_on.load(std::memory_order_relaxed) &&
        n >= threshold.load(std::memory_order_relaxed))
      advise(ptr, n);
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

  // release_block frees a block of the cache path and hands any other pointer to the inner
  // allocator's raw deleter, so raw_deallocate works for both kinds.
  c10::DeleterFnPtr raw_deleter() const override { return inner->raw_deleter() ? &release_block : nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner->copy_data(dest, src, count);
  }
};

HugePageAllocator g_allocator;  // static lifetime, as SetAllocator requires

// Takes idle blocks out, oldest first, until at most `keep` idle bytes remain; returns them (the
// caller frees them outside the lock). Call with the lock held.
std::vector<Block*> trim_locked(BlockCache& c, size_t keep) {
  std::vector<Block*> out;
  while (c.held > keep && !c.idle.empty()) {
    auto oldest = c.idle.begin();
    for (auto it = c.idle.begin(); it != c.idle.end(); ++it)
      if (it->second->stamp < oldest->second->stamp) oldest = it;
    c.held -= oldest->second->capacity;
    out.push_back(oldest->second);
    c.idle.erase(oldest);
  }
  return out;
}

// Takes out the idle blocks unused for longer than max_idle_us (appending them to `out`). Call
// with the lock held.
void expire_locked(BlockCache& c, std::vector<Block*>& out) {
  if (c.idle.empty()) return;
  const auto limit = std::chrono::steady_clock::now() - std::chrono::microseconds(c.max_idle_us.load());
  for (auto it = c.idle.begin(); it != c.idle.end();) {
    if (it->second->freed < limit) {
      c.held -= it->second->capacity;
      out.push_back(it->second);
      ++c.expired;
      it = c.idle.erase(it);
    } else {
      ++it;
    }
  }
}

void free_blocks(const std::vector<Block*>& blocks) {
  for (Block* b : blocks) delete b;  // the inner DataPtr's deleter frees the memory
}

// The deleter of every DataPtr the cache path hands out (and the wrapper's raw deleter).
void release_block(void* ptr) {
  BlockCache& c = cache();
  std::vector<Block*> drop;
  {
    std::unique_lock<std::mutex> lock(c.mu);
    auto it = c.live.find(ptr);
    if (it == c.live.end()) {  // not the cache's: an allocation of the inner allocator (raw_deallocate)
      c10::DeleterFnPtr raw = c.inner_raw;
      lock.unlock();
      if (raw != nullptr) raw(ptr);
      return;
    }
    Block* b = it->second;
    c.live.erase(it);
    const size_t cap = c.cap.load(std::memory_order_relaxed);
    if (cap == 0 || b->capacity > cap) {
      ++c.released;
      drop.push_back(b);
    } else {
      b->stamp = ++c.clock;
      b->freed = std::chrono::steady_clock::now();
      c.idle.emplace(b->capacity, b);
      c.held += b->capacity;
      drop = trim_locked(c, cap);
      c.evictions += static_cast<int64_t>(drop.size());
      if (c.held > c.held_peak) c.held_peak = c.held;
      expire_locked(c, drop);
    }
  }
  free_blocks(drop);
}

bool installed() { return c10::GetAllocator(c10::DeviceType::CPU) == &g_allocator; }

void atfork_prepare() { cache().mu.lock(); }
void atfork_unlock() { cache().mu.unlock(); }

// Puts the wrapper in torch's place (once). Returns whether it is the CPU allocator now: false
// when another allocator of a higher priority holds the place.
bool ensure_installed() {
  if (installed()) return true;
  c10::Allocator* current = c10::GetAllocator(c10::DeviceType::CPU);
  if (current == nullptr) throw std::runtime_error("huge_pages: torch has no CPU allocator registered");
  g_allocator.inner = current;
  {
    std::lock_guard<std::mutex> lock(cache().mu);
    cache().inner_raw = current->raw_deleter();
  }
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(&atfork_prepare, &atfork_unlock, &atfork_unlock); });
  c10::SetAllocator(c10::DeviceType::CPU, &g_allocator, kPriority);
  if (!installed()) {  // a higher-priority allocator is registered: leave it alone
    g_allocator.inner = nullptr;
    return false;
  }
  return true;
}

// Turns huge-page advice on (installing the wrapper), or sets its threshold. Returns whether the
// wrapper is the CPU allocator now.
bool install(int64_t threshold) {
  if (threshold < static_cast<int64_t>(kHugePage))
    throw py::value_error("huge_pages: threshold must be >= 2 MiB (" + std::to_string(kHugePage) +
                          " bytes), got " + std::to_string(threshold));
  g_allocator.threshold.store(static_cast<size_t>(threshold));
  if (!ensure_installed()) return false;
  g_allocator.advise_on.store(true);
  return true;
}

// Empties the cache down to `keep` idle bytes; returns the bytes given back to the inner allocator.
int64_t trim(size_t keep) {
  BlockCache& c = cache();
  std::vector<Block*> drop;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    drop = trim_locked(c, keep);
    for (Block* b : drop) bytes += static_cast<int64_t>(b->capacity);
  }
  free_blocks(drop);
  return bytes;
}

// Sets the block cache: at most `cap` idle bytes (0 turns it off and empties it) of freed
// allocations of at least `min_bytes`, each idle for at most `max_idle_s` seconds (checked at the
// cache's next allocation miss or free). Installs the wrapper (huge pages stay as they are) when
// cap > 0. Returns whether the wrapper is the CPU allocator now.
bool set_cache(int64_t cap, int64_t min_bytes, double max_idle_s) {
  if (!(max_idle_s > 0) || max_idle_s > 1e9)
    throw py::value_error("huge_pages.set_cache: max_idle_s must be > 0 seconds (at most 1e9), got " +
                          std::to_string(max_idle_s));
  if (cap < 0) throw py::value_error("huge_pages.set_cache: cap must be >= 0 bytes (0: off), got " + std::to_string(cap));
  if (min_bytes < kMinCacheBlock)
    throw py::value_error("huge_pages.set_cache: min_bytes must be >= " + std::to_string(kMinCacheBlock) +
                          ", got " + std::to_string(min_bytes));
  BlockCache& c = cache();
  if (cap == 0) {
    c.cap.store(0);
    trim(0);
    return installed();
  }
  if (!ensure_installed()) return false;
  c.min_bytes.store(static_cast<size_t>(min_bytes));
  c.max_idle_us.store(static_cast<int64_t>(max_idle_s * 1e6));
  c.cap.store(static_cast<size_t>(cap));
  trim(static_cast<size_t>(cap));
  return true;
}

// Puts the inner allocator back and empties the cache. Returns whether the wrapper was installed.
bool uninstall() {
  if (!installed()) return false;
  g_allocator.advise_on.store(false);
  cache().cap.store(0);
  trim(0);
  c10::SetAllocator(c10::DeviceType::CPU, g_allocator.inner, kPriority);
  return true;
}

py::dict state() {
  py::dict d;
  d["installed"] = installed();
  d["advise"] = installed() && g_allocator.advise_on.load();
  d["threshold"] = static_cast<int64_t>(g_allocator.threshold.load());
  d["advised_calls"] = g_allocator.advised_calls.load();
  d["advised_bytes"] = g_allocator.advised_bytes.load();
  d["failures"] = g_allocator.failures.load();
  const int e = g_allocator.last_errno.load();
  d["last_error"] = e == 0 ? std::string() : std::string(std::strerror(e));
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  d["cache_cap"] = static_cast<int64_t>(c.cap.load());
  d["cache_min_bytes"] = static_cast<int64_t>(c.min_bytes.load());
  d["cache_held"] = static_cast<int64_t>(c.held);
  d["cache_held_peak"] = static_cast<int64_t>(c.held_peak);
  d["cache_idle_blocks"] = static_cast<int64_t>(c.idle.size());
  d["cache_live_blocks"] = static_cast<int64_t>(c.live.size());
  d["cache_hits"] = c.hits;
  d["cache_misses"] = c.misses;
  d["cache_evictions"] = c.evictions;
  d["cache_expired"] = c.expired;
  d["cache_max_idle_s"] = static_cast<double>(c.max_idle_us.load()) / 1e6;
  d["cache_released"] = c.released;
  return d;
}

}  // namespace

void bind_huge_pages(py::module_& m) {
  py::module_ h = m.def_submodule("huge_pages", "torch's CPU allocator wrapped: madvise(MADV_HUGEPAGE) for large "
                                  "allocations and a capped cache of freed large blocks");
  h.def("install", &install, py::arg("threshold"),
        "Turn huge-page advice on, wrapping torch's CPU allocator (or set the threshold in bytes, >= 2 MiB); "
        "returns whether the wrapper is the CPU allocator now");
  h.def("uninstall", &uninstall,
        "Put the wrapped allocator back (advice and cache off, cache emptied); returns whether the wrapper was installed");
  h.def("set_cache", &set_cache, py::arg("cap"), py::arg("min_bytes"), py::arg("max_idle_s") = 30.0,
        "Keep at most cap idle bytes of freed allocations of >= min_bytes for reuse (0: off, emptied), "
        "each for at most max_idle_s seconds unused; returns whether the wrapper is the CPU allocator now");
  h.def("trim", [](int64_t keep) {
          if (keep < 0) throw py::value_error("huge_pages.trim: keep must be >= 0, got " + std::to_string(keep));
          return trim(static_cast<size_t>(keep));
        }, py::arg("keep") = 0, "Free idle cached blocks, oldest first, down to keep bytes; returns the bytes freed");
  h.def("state", &state, "{installed, advise, threshold, advised_calls, advised_bytes, failures, last_error, "
        "cache_cap, cache_min_bytes, cache_held, cache_held_peak, cache_idle_blocks, cache_live_blocks, "
        "cache_hits, cache_misses, cache_evictions, cache_expired, cache_max_idle_s, cache_released}");
  h.attr("HUGE_PAGE_BYTES") = static_cast<int64_t>(kHugePage);
}

}  // namespace gnncompile
