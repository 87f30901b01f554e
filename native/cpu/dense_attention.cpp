// gnncompile::dense_attention and gnncompile::dense_attention_backward on the CPU: scaled
// dot-product attention over [B, H, L, D] with a key padding mask (dense_attention_core.h), for
// the dense attention of graph transformers (passes/dense_attention.py rewrites
// nn.MultiheadAttention's call into it). CPU only: on CUDA the pass leaves torch's fused
// attention in place. Deterministic: every output row is produced by one thread in a fixed order.
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <vector>

#include "dense_attention_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

// The checks both ops share.
void check_dense(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const std::optional<at::Tensor>& kpm, double scale, const char* op) {
  check_cpu(q, op, "q");
  check_cpu(k, op, "k");
  check_cpu(v, op, "v");
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
                    ": q, k and v must be [B, H, L, D] tensors, got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), op,
                    ": q, k and v must share one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
                    v.scalar_type());
  TORCH_CHECK_VALUE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble, op,
                    ": supports float32 and float64, got ", q.scalar_type());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes(), op, ": k and v must have one shape, got ", k.sizes(), " and ",
                    v.sizes());
  TORCH_CHECK_VALUE(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
                    ": q [B, H, L, D] and k [B, H, S, D] disagree: ", q.sizes(), " and ", k.sizes());
  TORCH_CHECK_VALUE(q.size(3) <= kDenseMaxHeadDim, op, ": head dim D must be at most ", kDenseMaxHeadDim,
                    ", got ", q.size(3));
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  if (kpm.has_value() && kpm->defined()) {
    check_cpu(*kpm, op, "key_padding_mask");
    TORCH_CHECK_VALUE(kpm->scalar_type() == at::kBool || kpm->scalar_type() == q.scalar_type(), op,
                      ": key_padding_mask must be bool (true: ignore the key) or q's dtype (added to the logits), got ",
                      kpm->scalar_type());
    TORCH_CHECK_VALUE(kpm->dim() == 2 && kpm->size(0) == k.size(0) && kpm->size(1) == k.size(2), op,
                      ": key_padding_mask must be [B, S] = [", k.size(0), ", ", k.size(2), "], got ", kpm->sizes());
  }
}

// The kept keys of each batch (key_ptr [B + 1], ids); a float mask's values at them into bias
// (left empty where they are all 0: nothing to add).
template <typename T>
void kept_keys(const std::optional<at::Tensor>& kpm, int64_t B, int64_t S, std::vector<int64_t>& key_ptr,
               std::vector<int64_t>& ids, std::vector<T>& bias) {
  key_ptr.assign(static_cast<size_t>(B + 1), 0);
  ids.clear();
  bias.clear();
  ids.reserve(static_cast<size_t>(B * S));
  const bool has = kpm.has_value() && kpm->defined();
  const at::Tensor m = has ? kpm->contiguous() : at::Tensor();
  const bool* mb = has && m.scalar_type() == at::kBool ? m.const_data_ptr<bool>() : nullptr;
  const T* mf = has && m.scalar_type() != at::kBool ? m.const_data_ptr<T>() : nullptr;
  bool nonzero = false;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      if (mb != nullptr && mb[b * S + s]) continue;
      if (mf != nullptr) {
        const T x = mf[b * S + s];
        if (std::isinf(x) && x < 0) continue;
        bias.push_back(x);
        nonzero = nonzero || x != T(0);
      }
      ids.push_back(s);
    }
    key_ptr[static_cast<size_t>(b + 1)] = static_cast<int64_t>(ids.size());
  }
  if (!nonzero) bias.clear();
}

template <typename T>
DenseAttentionArgs<T> dense_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                                 const std::vector<int64_t>& key_ptr, const std::vector<int64_t>& ids) {
  DenseAttentionArgs<T> a;
  a.q = q.const_data_ptr<T>();
  a.k = k.const_data_ptr<T>();
  a.v = v.const_data_ptr<T>();
  a.B = q.size(0);
  a.H = q.size(1);
  a.L = q.size(2);
  a.S = k.size(2);
  a.D = q.size(3);
  for (int d = 0; d < 4; ++d) {
    a.qs[d] = q.stride(d);
    a.ks[d] = k.stride(d);
    a.vs[d] = v.stride(d);
  }
  a.key_ptr = key_ptr.data();
  a.ids = ids.data();
  a.scale = static_cast<T>(scale);
  return a;
}

std::tuple<at::Tensor, at::Tensor> dense_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const std::optional<at::Tensor>& kpm, double scale,
                                                       c10::IntArrayRef /*knobs*/) {
  const char* op = "gnncompile.dense_attention";
  check_dense(q, k, v, kpm, scale, op);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), S = k.size(2);
  at::Tensor out = at::empty({B, H, L, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor lse = at::empty({B, H, L}, q.options());
  if (out.numel() == 0 && lse.numel() == 0) return {out, lse};
  std::vector<int64_t> key_ptr, ids;
  const int64_t qblocks = (L + kDenseQueryBlock - 1) / kDenseQueryBlock;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "dense_attention", [&] {
    std::vector<scalar_t> bias;
    kept_keys<scalar_t>(kpm, B, S, key_ptr, ids, bias);
    DenseAttentionArgs<scalar_t> a = dense_args<scalar_t>(q, k, v, scale, key_ptr, ids);
    a.bias = bias.empty() ? nullptr : bias.data();
    scalar_t* o = out.data_ptr<scalar_t>();
    scalar_t* ls = lse.data_ptr<scalar_t>();
    dense_dispatch_dim<scalar_t>(D, [&](auto dp) {
      constexpr int Dp = decltype(dp)::value;
      at::parallel_for(0, B * H * qblocks, 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t bh = u / qblocks, qb = u % qblocks;
          const int64_t i0 = qb * kDenseQueryBlock, i1 = std::min<int64_t>(L, i0 + kDenseQueryBlock);
          dense_attention_forward_unit<scalar_t, Dp>(a, bh / H, bh % H, i0, i1, o, ls);
        }
      });
    });
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dense_attention_backward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& kpm,
    double scale, const at::Tensor& out_in, const at::Tensor& lse_in, const at::Tensor& grad_in,
    c10::IntArrayRef /*knobs*/) {
  const char* op = "gnncompile.dense_attention_backward";
  check_dense(q, k, v, kpm, scale, op);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), S = k.size(2);
  for (const at::Tensor* t : {&out_in, &grad_in}) {
    check_cpu(*t, op, "out / grad");
    TORCH_CHECK_VALUE(t->sizes() == q.sizes() && t->scalar_type() == q.scalar_type(), op,
                      ": out and grad must be [B, H, L, D] tensors of q's shape and dtype, got ", t->sizes(), " ",
                      t->scalar_type());
  }
  check_cpu(lse_in, op, "lse");
  TORCH_CHECK_VALUE(lse_in.dim() == 3 && lse_in.size(0) == B && lse_in.size(1) == H && lse_in.size(2) == L &&
                        lse_in.scalar_type() == q.scalar_type(),
                    op, ": lse must be [B, H, L] of q's dtype, got ", lse_in.sizes(), " ", lse_in.scalar_type());
  const at::Tensor out = out_in.contiguous(), lse = lse_in.contiguous(), grad = grad_in.contiguous();
  auto c = q.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor g_q = at::empty({B, H, L, D}, c), g_k = at::empty({B, H, S, D}, c), g_v = at::empty({B, H, S, D}, c);
  if (B * H == 0) return {g_q, g_k, g_v};
  std::vector<int64_t> key_ptr, ids;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "dense_attention", [&] {
    std::vector<scalar_t> bias;
    kept_keys<scalar_t>(kpm, B, S, key_ptr, ids, bias);
    DenseAttentionArgs<scalar_t> a = dense_args<scalar_t>(q, k, v, scale, key_ptr, ids);
    a.bias = bias.empty() ? nullptr : bias.data();
    const scalar_t* o = out.const_data_ptr<scalar_t>();
    const scalar_t* ls = lse.const_data_ptr<scalar_t>();
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    scalar_t* gq = g_q.data_ptr<scalar_t>();
    scalar_t* gk = g_k.data_ptr<scalar_t>();
    scalar_t* gv = g_v.data_ptr<scalar_t>();
    dense_dispatch_dim<scalar_t>(D, [&](auto dp) {
      constexpr int Dp = decltype(dp)::value;
      at::parallel_for(0, B * H, 1, [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u)
          dense_attention_backward_unit<scalar_t, Dp>(a, u / H, u % H, o, ls, g, gq, gk, gv);
      });
    });
  });
  return {g_q, g_k, g_v};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("dense_attention", &dense_attention_cpu);
  m.impl("dense_attention_backward", &dense_attention_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
