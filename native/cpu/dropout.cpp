// gnncompile::dropout on the CPU: out[i] = x[i] / (1 - p) where a counter-based random number
// of (seed, i) keeps element i, else x[i] * 0 (as torch's x * mask: a dropped NaN or infinity
// gives NaN, not 0). The mask is a function of (seed, i) alone, so the
// backward is the same op on the gradient with the same seed (nothing stored), and the result
// does not depend on the number of threads. One parallel pass, where torch's bernoulli_ draws
// from one sequential generator (the cost of dropout on wide inputs: Cora's 2708 x 1433
// features, benchmarks/cora_examples.py). The Python reference (ops/reference.py) gives the
// same mask bit for bit.
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../common/counter_rng.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

constexpr int64_t kDropoutGrain = 1 << 15;

// 32 random bits per element (../common/counter_rng.h), drawn a block at a time: blocks never
// cross a multiple of 2^32, so the first key word is fixed per block, and the loop of plain uint32
// arithmetic vectorises.
constexpr int64_t kBlock = 1024;

inline void draw_block(uint64_t key, int64_t b0, int64_t len, uint32_t* r) {
  const uint32_t k1 = draw_key1(key, b0), k2 = static_cast<uint32_t>(key >> 32);
  const uint32_t lo0 = static_cast<uint32_t>(b0);
  for (int64_t k = 0; k < len; ++k) r[k] = draw_bits(k1, k2, lo0 + static_cast<uint32_t>(k));
}

at::Tensor dropout_cpu(const at::Tensor& x_in, double p, const at::Tensor& seed) {
  const char* op = "gnncompile.dropout";
  check_cpu(x_in, op, "x");
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, op, ": p must be in [0, 1), got ", p);
  TORCH_CHECK_VALUE(seed.numel() == 1 && seed.scalar_type() == at::kLong && seed.device().is_cpu(), op,
                    ": seed must be one int64 on the CPU");
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const uint64_t base = splitmix64(static_cast<uint64_t>(seed.item<int64_t>()));
  const uint32_t threshold = keep_threshold(p);  // keep iff the draw >= it (p < 1)
  const int64_t n = x.numel();
  GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    using acc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
    const acc_t scale = static_cast<acc_t>(1.0 / (1.0 - p));
    const scalar_t* xv = x.const_data_ptr<scalar_t>();
    scalar_t* ov = out.data_ptr<scalar_t>();
    // tasks start on block boundaries, so every block is whole but the last
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    at::parallel_for(0, blocks, std::max<int64_t>(1, kDropoutGrain / kBlock), [&](int64_t bb, int64_t be) {
      uint32_t r[kBlock];
      for (int64_t b = bb; b < be; ++b) {
        const int64_t b0 = b * kBlock, len = std::min<int64_t>(kBlock, n - b0);
        draw_block(base, b0, len, r);
        const scalar_t* xb = xv + b0;
        scalar_t* ob = ov + b0;
        for (int64_t k = 0; k < len; ++k)
          ob[k] = static_cast<scalar_t>(static_cast<acc_t>(xb[k]) * (r[k] >= threshold ? scale : acc_t(0)));
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("dropout", &dropout_cpu); }

}  // namespace cpu
}  // namespace gnncompile
