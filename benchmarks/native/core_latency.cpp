// How far apart are two CPUs? The round trip of one cache line between a thread pinned to each
// (one writes 1 and waits for 0, the other waits for 1 and writes 0), in ns: the median of
// `runs` runs of `n` round trips. Used by benchmarks/profile_ab.py (benchmarks/_common.py
// core_latency_ns builds it) as a probe of the machine's state between the fresh processes of
// an A/B: on the 2-vCPU KVM guest of the project's Zen 4 figures the two vCPUs' round trip moves
// between about 120-200 ns (50 at times) and 330-530 ns over tens of seconds (presumably the host moving the
// vCPUs), and the neighbor workload's 2-thread step runs 1.25-1.5x slower while it is far
// (benchmarks/results/neighbor_states_zen4_s60.md).
//
//   g++ -O2 -pthread benchmarks/native/core_latency.cpp -o /tmp/core_latency && /tmp/core_latency 0 1
//
// Arguments: cpu_a cpu_b [n = 20000] [runs = 3]. Prints one number (ns); exits 2 when a thread
// cannot be pinned (the CPU is not this process's).
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {
alignas(64) std::atomic<int> flag{0};
alignas(64) std::atomic<int> ok{1};

bool pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof s, &s) == 0;
}

double run_once(int a, int b, int n) {
  flag.store(0);
  std::thread other([&] {
    if (!pin(b)) ok.store(0);
    for (int i = 0; i < n && ok.load(std::memory_order_relaxed); i++) {
      while (flag.load(std::memory_order_acquire) != 1) {
        if (!ok.load(std::memory_order_relaxed)) return;
      }
      flag.store(0, std::memory_order_release);
    }
  });
  if (!pin(a)) ok.store(0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n && ok.load(std::memory_order_relaxed); i++) {
    flag.store(1, std::memory_order_release);
    while (flag.load(std::memory_order_acquire) != 0) {
      if (!ok.load(std::memory_order_relaxed)) break;
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  other.join();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: core_latency CPU_A CPU_B [N] [RUNS]\n");
    return 1;
  }
  int a = std::atoi(argv[1]), b = std::atoi(argv[2]);
  int n = argc > 3 ? std::atoi(argv[3]) : 20000, runs = argc > 4 ? std::atoi(argv[4]) : 3;
  if (n < 1 || runs < 1) return 1;
  std::vector<double> v;
  for (int r = 0; r < runs; r++) v.push_back(run_once(a, b, n));
  if (!ok.load()) return 2;
  std::sort(v.begin(), v.end());
  std::printf("%.1f\n", v[v.size() / 2]);
  return 0;
}
