// The registry of generated message kernels (gnncompile/codegen): Python compiles a kernel for
// one message program, loads it and registers its address under the program's key; the CPU glue
// of gnncompile::message_reduce (message.cpp) looks the key of every call up and, when a kernel
// is registered, runs it inside its own checks and row split instead of the interpreter.
#pragma once
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codegen_abi.h"

namespace gnncompile {
namespace cpu {

// The key of a message op's call, as gnncompile/codegen/emit.py's Spec.key writes it:
// "v<abi>|<op>|<f32|f64>|<i32|i64>|c<code,...>|k<const bits in hex,...>|i<side><kind>,..."
// with op r<reduce> (message_reduce), m<result.result...> (message_sum_multi) or
// e<by_slot 0|1><f|g> (message_edges, output of width F or group sums), n<enc>.<0|1><f|g>
// (message_encoder_grad: the encoder's input, its features' gradient wanted, its width class), and input kind f (W == F),
// s (W == 1) or g (any other divisor of F); an edge encoder's input (side 5) has the kind of its
// output's width (input k + 1's) and then d<D> (its features, input k's width).
std::string codegen_key(const std::string& op, bool f64, bool i64, c10::IntArrayRef code,
                        c10::ArrayRef<double> consts, c10::IntArrayRef sides, const std::vector<int64_t>& widths,
                        int64_t F);
std::string reduce_op_key(int reduce);
std::string multi_op_key(c10::IntArrayRef results);
std::string edges_op_key(bool by_slot, int64_t out_width, int64_t F);
// message_encoder_grad: n<enc>.<need_features 0|1><f|g> (g: the encoder's W below F)
std::string encoder_grad_op_key(int64_t enc, bool need_features, int64_t W, int64_t F);

// The kernel registered under key, or nullptr. Costs one atomic load while none is registered.
GenRowsFn find_generated(const std::string& key);
bool any_generated();
void count_generated_call();

}  // namespace cpu
}  // namespace gnncompile
