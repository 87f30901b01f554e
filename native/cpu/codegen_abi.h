// The C ABI between the glue (native/cpu/message.cpp, message_codegen.cpp) and the message
// kernels that gnncompile/codegen generates, compiles and loads at run time. Torch-free: the
// generated sources include this header (and rows_core.h / reduce_core.h), never torch's.
//
// A generated kernel is one extern "C" function, kCodegenSymbol, that walks rows
// [row_begin, row_end) of one message program (its instructions, constants, input sides and
// widths, dtypes and what it computes fixed at generation time: message_reduce with its reduction,
// message_sum_multi with its result slots, message_edges with its output order and width class)
// (message_encoder_grad: its encoder's input and whether its features need a gradient too)
// and returns a Status as an int. The
// glue runs every check of the interpreter first, then calls it once per chunk of the balanced
// row split (parallel_rows, glue.h), so generated kernels keep the split, the knobs and the
// determinism of the interpreter.
#pragma once
#include <cstdint>

namespace gnncompile {
namespace cpu {

// Bumped whenever GenArgs or the function's meaning changes: a kernel of another version is
// not loaded (gnncompile/codegen/build.py asks the .so for kCodegenAbiSymbol).
constexpr int kCodegenAbi = 3;

struct GenArgs {
  const void* rowptr;            // [M + 1], index_t
  const void* col;               // [E], index_t
  const void* perm;              // [E], index_t
  const void* slot;              // [E], index_t: CSR slot of each traversed slot, or nullptr
  const void* const* inputs;     // n_inputs pointers to contiguous [rows, W_k] scalar_t tensors
  const int64_t* widths;         // W_k
  const int64_t* divs;           // F / W_k
  int64_t n_inputs;
  int64_t F;
  int64_t num_src;               // rows of the neighbour inputs (checked against col)
  int64_t num_edges;             // E (checked against perm / slot / rowptr)
  int64_t prefetch;              // slots ahead whose rows are prefetched (knobs[1])
  void* out;                     // reduce: [M, F]; sum_multi: [K, M, F]; edges: [E, out_width] scalar_t
  int64_t* arg;                  // [M, F] for max / min, else nullptr
  int64_t out_width;             // edges: W_out (F for an output of the message's width)
  int64_t M;                     // rows of the structure (sum_multi: the stride of its K results)
  // encoder_grad: out is the chunk's accumulators [dWt (D x W) | db (W) | scratch (kEncoderGradBlock x W)] (scalar_t),
  // out_width W, out2 the features' gradient [E, D] (scalar_t) or nullptr when not needed
  void* out2;
};

using GenRowsFn = int (*)(const GenArgs*, int64_t row_begin, int64_t row_end);

}  // namespace cpu
}  // namespace gnncompile

#define GNNCOMPILE_CODEGEN_SYMBOL "gnncompile_message_rows"
#define GNNCOMPILE_CODEGEN_ABI_SYMBOL "gnncompile_codegen_abi"
