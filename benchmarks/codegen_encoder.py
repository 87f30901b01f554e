"""An edge encoder inside a generated message kernel (side enc, gnncompile/ops/program.py) against the tuned spmm.

    python -m benchmarks codegen_encoder            # 100k nodes / 1M edges, F = 128, D = 16, 2 threads
    python -m benchmarks codegen_encoder --quick    # 10k nodes / 100k edges, fewer rounds
    MALLOC_MMAP_THRESHOLD_=65536 python -m benchmarks codegen_encoder --backward   # the backward

A power-law graph (gnncompile.data.synthetic.power_law_graph, N nodes, 10 N edges, seed 0), its
CSR by destination (gnncompile::build_csr), node features x [N, F], edge features a [E, D] and a
linear map (Wt [D, F], b [1, F]), float32, N(0, 1). Variants, each the forward sum over every row:

  spmm                 gnncompile's tuned spmm of x_j (no weight): the floor a message kernel is
                       measured against (issue 25: the fused encoder within 1.5x of it)
  generated            relu(x_j + lin(a_e)), lin computed per edge inside the generated kernel
                       (b + a[e] @ Wt, the E x F encoded edges never in memory), for 5 edges at
                       once (native/cpu/encoder_core.h, EncoderBlock)
  generated_edge_by_edge  the same kernel as generated before its encoder went by blocks of edges
                       (encode_run per edge, the knob's prefetch distance): before / after in one run
  generated_slot       the same kernel reading the edge features in CSR slot order (side enc_slot) from
                       a copy a[perm] made once before the rounds: what a training loop over a fixed
                       graph runs once the copy is cached (gnncompile/ops/slots.py)
  generated_slot_cached  generated_slot with the cache's lookup in each call (slots.slot_copy, check mode
                       'off': the identity and version counter; the copy made once)
  generated_slot_checked  the same with check mode 'cpu' (the default): the lookup also fingerprints the
                       features' bytes, against writes that bypass the version counter
  generated_slot_fresh a fresh copy (gnncompile::slot_rows) and the slot kernel in every call: what a
                       tensor seen once pays
  interpreter          the same program run by the interpreter (native/cpu/message_core.h)
  encoder_alone        the generated kernel of the sum of lin(a_e) alone (no x_j): what computing
                       the encoder costs, its feature rows read through the edge permutation
  materialized         the unfused alternative: e = torch.addmm(b, a, Wt) ([E, F] written), then
                       the generated kernel of relu(x_j + e) reading e per edge
  gather_only          a floor, not a result: the generated kernel's own source with the mat-vec
                       replaced by one add per column (e[t] = b[t] + a_e[0]): the same walk, the
                       same gather of x_j, the same read of each edge's feature row (one cache
                       line at D = 16), the same relu and sum, without the D products per column.
                       What the kernel would cost if the encoder's arithmetic were free
  matvec_only          a floor, not a result: encoder_alone's kernel with every edge reading edge
                       0's features (perm all 0): the mat-vec's arithmetic and the walk, no x_j, no
                       feature row from memory. What the kernel would cost if memory were free

--overlap adds kernels that take the gather and the arithmetic apart (issue 25: do they overlap?):

  walk_only            a floor: the generated kernel with no edge walked (every row's loop empty):
                       the output's allocation, the row walk and the stores, which every variant pays
  x_row0               the generated kernel with every edge reading x row 0 and no prefetch of the
                       x rows (the edge features and their prefetch as generated): without the gather
  x_row0_prefetched    x_row0 with the x rows' prefetches still issued (their lines never read):
                       what issuing the gather's prefetches costs the arithmetic
  one_pass             a hand-written kernel (F = 128, float32, int64 indices only) that computes
                       the 5-edge encoder block, adds x_j, applies the relu and adds into each row's
                       sum in one function, the rows' sums crossing blocks (no per-edge tile loop, no
                       [5, 128] block of values stored and loaded back); its prefetches 15 slots
                       ahead, issued in one burst per block. Equal bit for bit to the interpreter

Agreement before any timing: generated and interpreted results bit for bit; the materialized
variant close to them (addmm sums in its own order). Then --rounds rounds, each calling every
variant once in turn; medians, and the median of the rounds' ratios to spmm.

Writes benchmarks/results/codegen_encoder[_quick].{json,md} (--out NAME: NAME.{json,md}).

--backward: the backward of the same sum (upstream gradient N(0, 1)), the encoder's gradients
(a, Wt, b) by the two paths of gnncompile/ops/message.py (ENCODER_GRAD), generated kernels on:

  per_edge             the old path: the value gradient G * step(x_j + lin(a_e)) per edge by
                       message_edges ([E, F] written), then dk Wt^T, a^T dk and dk's column sums
  accumulate           gnncompile::message_encoder_grad: one pass over the edges, dWt and db
                       accumulated per chunk of the row split, da written per edge ([E, D])
  accumulate_interp    the same op run by the interpreter
  accumulate_slot      accumulate with the features in CSR slot order (side enc_slot, a copy made
                       once): dWt and db bit for bit accumulate's, da per CSR slot

each alone ("encoder_grads": the op calls only) and inside the whole backward ("backward":
autograd.grad of the sum for x, a, Wt and b; x's gradient is the same CSC pass in both). Peak
memory: the resident high-water mark added by one call (run with MALLOC_MMAP_THRESHOLD_=65536
so that every large tensor is its own mapping). Agreement first: the two paths within float
tolerance, generated == interpreter bit for bit. Writes codegen_encoder_backward.{json,md}.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import statistics
import sys
import time
from typing import Dict, List

import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops

from . import _common
from .codegen import _rounds, _summary  # (interleaved rounds, medians and ratios: as codegen's)

_emit = importlib.import_module("gnncompile.codegen.emit")  # (the package's name emit is its function)


def run(N: int, F: int, D: int, rounds: int, overlap: bool = False, only=()) -> dict:
    torch.manual_seed(0)
    ei = power_law_graph(N, 10 * N, seed=0)
    E = int(ei.size(1))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    a = torch.randn(E, D, generator=g)
    wt = torch.randn(D, F, generator=g) / D ** 0.5
    b = torch.randn(1, F, generator=g)
    knobs: List[int] = []
    relu = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    enc_ins, enc_sides = [x, a, wt, b], [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = relu

    def run_enc():
        return ops.message_reduce(rowptr, col, perm, enc_ins, enc_sides, code, consts, F, "sum", knobs, [], None)[0]

    def run_materialized():
        e = torch.addmm(b, a, wt)
        return ops.message_reduce(rowptr, col, perm, [x, e], [P.COL, P.EDGE], code, consts, F, "sum", knobs, [],
                                  None)[0]

    alone = P.encode(P.inp(0))

    def run_alone():
        return ops.message_reduce(rowptr, col, perm, [a, wt, b], [P.ENC, P.CONST, P.CONST], *alone, F, "sum", knobs,
                                  [], None)[0]

    perm0 = torch.zeros_like(perm)

    def run_matvec_only():
        return ops.message_reduce(rowptr, col, perm0, [a, wt, b], [P.ENC, P.CONST, P.CONST], *alone, F, "sum", knobs,
                                  [], None)[0]

    def run_spmm():
        return ops.spmm(rowptr, col, perm, None, x, "sum", knobs)[0]

    from gnncompile.ops import slots as S
    from gnncompile.ops.structure import Structure
    a_slot = ops.slot_rows(a, perm)
    slot_sides = [P.COL, P.ENCS, P.CONST, P.CONST]
    structure = Structure(rowptr, col, perm, N, 0, N - 1)

    def run_slot(rows=None):
        return ops.message_reduce(rowptr, col, perm, [x, a_slot if rows is None else rows, wt, b], slot_sides, code,
                                  consts, F, "sum", knobs, [], None)[0]

    def run_slot_cached():
        return run_slot(S.slot_copy(structure, a, "off"))

    def run_slot_checked():
        return run_slot(S.slot_copy(structure, a, "cpu"))

    def run_slot_fresh():
        return run_slot(ops.slot_rows(a, perm))

    e_like = torch.empty(E, F)
    codegen.reset()
    ref = run_enc()  # the interpreter
    t0 = time.perf_counter()
    ok = [codegen.prepare(enc_ins, enc_sides, code, consts, F, "sum", rowptr.dtype, force=True),
          codegen.prepare([x, e_like], [P.COL, P.EDGE], code, consts, F, "sum", rowptr.dtype, force=True),
          codegen.prepare([a, wt, b], [P.ENC, P.CONST, P.CONST], *alone, F, "sum", rowptr.dtype, force=True),
          codegen.prepare([x, a_slot, wt, b], slot_sides, code, consts, F, "sum", rowptr.dtype, force=True)]
    prepare_s = time.perf_counter() - t0
    del e_like
    if not all(ok):
        raise RuntimeError("codegen_encoder benchmark: no generated kernel (no C++ compiler?)")
    calls = codegen.calls()
    gen, mat = run_enc(), run_materialized()
    if codegen.calls() != calls + 2:
        raise RuntimeError("codegen_encoder benchmark: the generated kernels did not run")
    calls = codegen.calls()
    slot_out = run_slot_checked()
    if codegen.calls() != calls + 1:
        raise RuntimeError("codegen_encoder benchmark: the generated slot-order kernel did not run")
    agreement = {"generated_vs_interpreter_bitwise": torch.equal(gen.view(torch.int32), ref.view(torch.int32)),
                 "generated_slot_vs_generated_bitwise": torch.equal(slot_out.view(torch.int32),
                                                                    gen.view(torch.int32)),
                 "materialized_vs_generated_close": bool(torch.allclose(mat, gen, rtol=1e-4, atol=1e-3)),
                 "materialized_vs_generated_max_abs_diff": float((mat - gen).abs().max())}
    if not (agreement["generated_vs_interpreter_bitwise"] and agreement["materialized_vs_generated_close"]
            and agreement["generated_slot_vs_generated_bitwise"]):
        raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")

    def interp():
        codegen.suspend()

    codegen.suspend()
    ref_alone = run_alone()
    codegen.resume()
    calls = codegen.calls()
    gen_alone = run_alone()
    if codegen.calls() != calls + 1:
        raise RuntimeError("codegen_encoder benchmark: the generated kernel of the encoder alone did not run")
    agreement["encoder_alone_generated_vs_interpreter_bitwise"] = torch.equal(gen_alone.view(torch.int32),
                                                                              ref_alone.view(torch.int32))
    if not agreement["encoder_alone_generated_vs_interpreter_bitwise"]:
        raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")
    key, gather_addr = gather_only_kernel(enc_ins, enc_sides, code, consts, F, rowptr.dtype)

    def gather_only():  # the floor kernel, registered under the encoder's key for its own call only
        codegen.resume()
        codegen._native().register(key, gather_addr)

    def run_checked(name, register, run=run_enc):  # one call with `register`'s kernel; it must run
        register()
        calls = codegen.calls()
        out = run()
        if codegen.calls() != calls + 1:
            raise RuntimeError(f"codegen_encoder benchmark: the {name} kernel did not run")
        return out

    run_checked("gather_only", gather_only)
    edge_addr = edge_by_edge_kernel(enc_ins, enc_sides, code, consts, F, rowptr.dtype)

    def edge_by_edge():  # the kernel before blocks of edges, registered under the same key for its call only
        codegen.resume()
        codegen._native().register(key, edge_addr)

    old = run_checked("edge_by_edge", edge_by_edge)
    agreement["edge_by_edge_vs_generated_bitwise"] = torch.equal(old.view(torch.int32), gen.view(torch.int32))
    if not agreement["edge_by_edge_vs_generated_bitwise"]:
        raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")
    del old
    fns = {"spmm": (codegen.resume, run_spmm), "generated": (codegen.resume, run_enc),
           "generated_slot": (codegen.resume, run_slot), "generated_slot_cached": (codegen.resume, run_slot_cached),
           "generated_slot_checked": (codegen.resume, run_slot_checked),
           "generated_slot_fresh": (codegen.resume, run_slot_fresh),
           "generated_edge_by_edge": (edge_by_edge, run_enc),
           "gather_only": (gather_only, run_enc),
           "materialized": (codegen.resume, run_materialized), "interpreter": (interp, run_enc),
           "encoder_alone": (codegen.resume, run_alone),
           "matvec_only": (codegen.resume, run_matvec_only)}
    if overlap:
        for name, addr in overlap_kernels(enc_ins, enc_sides, code, consts, F, rowptr.dtype).items():
            def use(addr=addr):  # registered under the encoder's key for its own call only
                codegen.resume()
                codegen._native().register(key, addr)

            out = run_checked(name, use)
            if name == "one_pass":
                agreement["one_pass_vs_interpreter_bitwise"] = torch.equal(out.view(torch.int32), ref.view(torch.int32))
                if not agreement["one_pass_vs_interpreter_bitwise"]:
                    raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")
            fns[name] = (use, run_enc)
            del out
    if only:
        fns = {k: v for k, v in fns.items() if k in only or k == "spmm"}
    times = _rounds(fns, rounds)
    codegen.reset()
    return {"N": N, "E": E, "F": F, "D": D, "dtype": "float32", "prepare_in_process_s": prepare_s,
            "agreement": agreement, "forward_sum": _summary(times, "spmm")}


_ENCODE_CALL = re.compile(r"(e\d+) = eb\.e\d+\.get\(j, jlim, perm, a\.num_edges, (in\d+), (\d+), (wt\d+), (ew\d+), "
                          r"(bs\d+), f0, n\);")


def edge_by_edge_kernel(inputs, sides, code, consts, F: int, index_dtype):
    """The address of the kernel as generated before the encoder went by blocks of edges: its
    source with the block's call (EncoderBlock::get) replaced by encode_run for the one edge, the
    prefetch distance the knob's (kPrefetchScale 1). The same values bit for bit."""
    spec = _emit.make_spec(code, consts, sides, [int(t.shape[1]) for t in inputs], F, "sum", inputs[0].dtype,
                           index_dtype)
    src, n = _ENCODE_CALL.subn(lambda m: f"{{ alignas(64) static thread_local acc_t ev[TILE]; "
                                         f"encode_run<acc_t>({m[2]} + e * {m[3]}, {m[3]}, {m[4]} + f0, {m[5]}, "
                                         f"{m[6]} + f0, n, ev); {m[1]} = ev; }}", _emit.emit(spec))
    src = src.replace("constexpr int64_t kPrefetchScale = 3;", "constexpr int64_t kPrefetchScale = 1;")
    if n != 1:
        raise RuntimeError("codegen_encoder benchmark: the generated source has no encoder block call to replace")
    return build.load_kernel(src)


_ONE_PASS = r"""// benchmarks/codegen_encoder.py --overlap, one_pass: the sum of relu(x_j + lin(a_e)) over each row,
// F = 128, D = 16, float32, int64 indices, in one function per block of kEncodeBlock CSR slots
// (crossing rows, as the generated kernel's EncoderBlock): the block's mat-vec in registers, then
// per 32 columns x_j + value, the relu and the add into the row's sum. A measurement, not a kernel
// gnncompile emits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include "common/dtype.h"
#include "common/macros.h"
#include "cpu/codegen_abi.h"
#include "cpu/encoder_core.h"
#include "cpu/reduce_core.h"
#include "cpu/rows_core.h"
#include "cpu/vmath.h"
namespace {
using namespace gnncompile;
using namespace gnncompile::cpu;
using scalar_t = float;
using acc_t = float;
using index_t = int64_t;
constexpr int TILE = 128;
constexpr int K = kEncodeBlock;
constexpr int NV = kEncodeBlockVectors;
typedef acc_t vec __attribute__((vector_size(32)));
constexpr int L = 8;
constexpr int64_t PD = 15;  // the slots ahead whose x rows and feature rows are prefetched, one burst per block

// K edges' messages relu(x_j + b + a_e Wt), each added into its row's sum acc[k] (nullptr: no edge):
// encode_block's sums in its order, then x_j + value, the relu, the sum (the generated kernel's order).
__attribute__((noinline)) void block_msg(const scalar_t* const* fa, const scalar_t* const* xr, acc_t* const* acc,
                                         int64_t D, const scalar_t* w, int64_t W, const scalar_t* b, int n) {
#pragma GCC unroll 1
  for (int c0 = 0; c0 + L * NV <= n; c0 += L * NV) {
    vec r[K][NV];
#pragma GCC unroll 64
    for (int k = 0; k < K; ++k)
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) std::memcpy(&r[k][i], b + c0 + L * i, sizeof(vec));
#pragma GCC unroll 1
    for (int64_t d = 0; d < D; ++d) {
      vec y[NV];
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) std::memcpy(&y[i], w + d * W + c0 + L * i, sizeof(vec));
#pragma GCC unroll 64
      for (int k = 0; k < K; ++k) {
        const acc_t ad = fa[k][d];
#pragma GCC unroll 64
        for (int i = 0; i < NV; ++i) r[k][i] = r[k][i] + ad * y[i];
      }
    }
#pragma GCC unroll 64
    for (int k = 0; k < K; ++k) {
      if (acc[k] == nullptr) break;
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) {
        vec x0, s;
        std::memcpy(&x0, xr[k] + c0 + L * i, sizeof(vec));
        const vec v2 = x0 + r[k][i];
        const vec v3 = v2 < acc_t(0) ? vec{} : v2;
        std::memcpy(&s, acc[k] + c0 + L * i, sizeof(vec));
        s = s + v3;
        std::memcpy(acc[k] + c0 + L * i, &s, sizeof(vec));
      }
    }
  }
}

__attribute__((always_inline)) inline void prefetch_slot(const GenArgs& a, int64_t j) {
  const int64_t src = static_cast<int64_t>(static_cast<const index_t*>(a.col)[j]);
  const int64_t e = static_cast<int64_t>(static_cast<const index_t*>(a.perm)[j]);
  if (in_range(src, a.num_src)) {
    const char* p = reinterpret_cast<const char*>(static_cast<const scalar_t*>(a.inputs[0]) + src * a.widths[0]);
    for (int bb = 0; bb < TILE * 4; bb += 64) __builtin_prefetch(p + bb, 0, 2);
  }
  if (in_range(e, a.num_edges))
    __builtin_prefetch(static_cast<const scalar_t*>(a.inputs[1]) + e * 16, 0, 2);
}
}  // namespace

extern "C" int gnncompile_codegen_abi() { return kCodegenAbi; }

extern "C" int gnncompile_message_rows(const GenArgs* ap, int64_t row_begin, int64_t row_end) {
  const GenArgs& a = *ap;
  const index_t* rowptr = static_cast<const index_t*>(a.rowptr);
  const index_t* col = static_cast<const index_t*>(a.col);
  const index_t* perm = static_cast<const index_t*>(a.perm);
  const scalar_t* in0 = static_cast<const scalar_t*>(a.inputs[0]);
  const int64_t w0 = a.widths[0];
  const scalar_t* in1 = static_cast<const scalar_t*>(a.inputs[1]);
  const scalar_t* wt1 = static_cast<const scalar_t*>(a.inputs[2]);
  const scalar_t* bs1 = static_cast<const scalar_t*>(a.inputs[3]);
  const int64_t ew1 = a.widths[2];
  const int64_t F = a.F;
  const int n = static_cast<int>(F);
  scalar_t* out = static_cast<scalar_t*>(a.out);
  alignas(64) acc_t bufs[K + 1][TILE];
  acc_t* slot_acc[K + 1];
  for (int i = 0; i <= K; ++i) slot_acc[i] = bufs[i];
  if (row_begin >= row_end) return 0;
  // `row`: the first row not stored; [rb, re): its slots; j: the next slot to compute
  int64_t row = row_begin;
  if (!row_ok(rowptr, row, a.num_edges)) return static_cast<int>(Status::BadRowptr);
  int64_t rb = static_cast<int64_t>(rowptr[row]), re = static_cast<int64_t>(rowptr[row + 1]);
  int64_t j = rb;
  for (int t = 0; t < n; ++t) slot_acc[0][t] = reduce_init<Reduce::Sum, acc_t>();
  while (true) {
    // store the rows that are complete
    while (j == re) {
      store_reduced<scalar_t, Reduce::Sum, acc_t>(slot_acc[0], nullptr, nullptr, rb, re - rb, n, out + row * F, nullptr);
      if (++row == row_end) return 0;
      if (!row_ok(rowptr, row, a.num_edges)) return static_cast<int>(Status::BadRowptr);
      rb = static_cast<int64_t>(rowptr[row]);
      re = static_cast<int64_t>(rowptr[row + 1]);
      for (int t = 0; t < n; ++t) slot_acc[0][t] = reduce_init<Reduce::Sum, acc_t>();
    }
    // a block: up to K slots from j, crossing into later rows of the chunk
    const scalar_t* fa[K];
    const scalar_t* xr[K];
    acc_t* accp[K];
    int kk = 0, m = 0;           // m: the acc slot of the block's current row
    int64_t r = row, rre = re;   // the row of the slot being added, its end
    int64_t s = j;
    while (kk < K) {
      if (s == rre) {  // row r done: the next row with a slot, if the chunk has one
        int64_t r2 = r + 1;
        bool found = false;
        while (r2 < row_end) {
          if (!row_ok(rowptr, r2, a.num_edges)) break;  // checked again (and raised) when stored
          if (static_cast<int64_t>(rowptr[r2 + 1]) > s) { found = true; break; }
          ++r2;
        }
        if (!found) break;
        r = r2;
        rre = static_cast<int64_t>(rowptr[r + 1]);
        ++m;
        for (int t = 0; t < n; ++t) slot_acc[m][t] = reduce_init<Reduce::Sum, acc_t>();
      }
      const int64_t src = static_cast<int64_t>(col[s]);
      if (!in_range(src, a.num_src)) return static_cast<int>(Status::BadCol);
      const int64_t e = static_cast<int64_t>(perm[s]);
      if (!in_range(e, a.num_edges)) return static_cast<int>(Status::BadPerm);
      fa[kk] = in1 + e * 16;
      xr[kk] = in0 + src * w0;
      accp[kk] = slot_acc[m];
      ++kk;
      ++s;
    }
    for (int q = 0; q < kk; ++q) if (j + PD + q < a.num_edges) prefetch_slot(a, j + PD + q);
    for (int q = kk; q < K; ++q) { fa[q] = fa[kk - 1]; xr[q] = xr[kk - 1]; accp[q] = nullptr; }
    block_msg(fa, xr, accp, 16, wt1, ew1, bs1, n);
    j = s;
    // rows before the block's last row are complete: store them (m rows after `row` got slots)
    // walk rows from `row`, storing each complete one; the block's rows with slots map to acc 0..m
    int idx = 0;
    while (idx < m) {
      // row `row` is complete (its slots all in this or earlier blocks)
      store_reduced<scalar_t, Reduce::Sum, acc_t>(slot_acc[idx], nullptr, nullptr, rb, re - rb, n, out + row * F, nullptr);
      ++row;
      // empty rows between: stored as zeros
      while (true) {
        if (!row_ok(rowptr, row, a.num_edges)) return static_cast<int>(Status::BadRowptr);
        rb = static_cast<int64_t>(rowptr[row]);
        re = static_cast<int64_t>(rowptr[row + 1]);
        if (re > rb) break;
        alignas(64) acc_t z[TILE];
        for (int t = 0; t < n; ++t) z[t] = reduce_init<Reduce::Sum, acc_t>();
        store_reduced<scalar_t, Reduce::Sum, acc_t>(z, nullptr, nullptr, rb, 0, n, out + row * F, nullptr);
        ++row;
      }
      ++idx;
    }
    if (m > 0) std::swap(slot_acc[0], slot_acc[m]);
  }
}
"""


def overlap_kernels(inputs, sides, code, consts, F: int, index_dtype) -> Dict[str, int]:
    """The --overlap kernels' addresses (walk_only, x_row0, x_row0_prefetched: the encoder
    program's generated source edited; one_pass: _ONE_PASS, where F = 128, D = 16, float32 and
    int64 indices)."""
    spec = _emit.make_spec(code, consts, sides, [int(t.shape[1]) for t in inputs], F, "sum", inputs[0].dtype,
                           index_dtype)
    src = _emit.emit(spec)

    def edit(*pairs):
        out = src
        for old, new in pairs:
            if old not in out:
                raise RuntimeError(f"codegen_encoder --overlap: the generated source has no {old!r}")
            out = out.replace(old, new)
        return build.load_kernel(out)

    row0 = ("const scalar_t* p0 = in0 + src * w0;", "const scalar_t* p0 = in0 + 0 * src;")
    x_prefetch = ("for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2); }",
                  "(void)p; (void)bytes; }")
    out = {"walk_only": edit(("for (int64_t j = begin; j < end; ++j) {", "for (int64_t j = begin; j < begin; ++j) {")),
           "x_row0": edit(row0, x_prefetch), "x_row0_prefetched": edit(row0)}
    if (F, int(inputs[1].shape[1]), inputs[0].dtype, index_dtype) == (128, 16, torch.float32, torch.int64):
        out["one_pass"] = build.load_kernel(_ONE_PASS)
    return out


def gather_only_kernel(inputs, sides, code, consts, F: int, index_dtype):
    """The key of the encoder program's generated kernel, and the address of the floor kernel:
    its source with the encoder's mat-vec (a block's, EncoderBlock::get) replaced by e[t] = b[t] + a_e[0]."""
    spec = _emit.make_spec(code, consts, sides, [int(t.shape[1]) for t in inputs], F, "sum", inputs[0].dtype,
                           index_dtype)
    src = _emit.emit(spec)
    src, n = _ENCODE_CALL.subn(lambda m: f"{{ alignas(64) static thread_local acc_t ev[TILE]; const scalar_t* pe = "
                                         f"{m[2]} + e * {m[3]}; for (int t = 0; t < n; ++t) ev[t] = "
                                         f"acc_t({m[6]}[f0 + t]) + acc_t(pe[0]); {m[1]} = ev; }}", src)
    if n != 1:
        raise RuntimeError("codegen_encoder benchmark: the generated source has no encoder block call to replace")
    return spec.key(), build.load_kernel(src)


def run_backward(N: int, F: int, D: int, rounds: int) -> dict:
    from gnncompile.ops import message as M
    torch.manual_seed(0)
    ei = power_law_graph(N, 10 * N, seed=0)
    E = int(ei.size(1))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    a = torch.randn(E, D, generator=g)
    wt = torch.randn(D, F, generator=g) / D ** 0.5
    b = torch.randn(1, F, generator=g)
    up = torch.randn(N, F, generator=g)
    code, consts = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    sides = [P.COL, P.ENC, P.CONST, P.CONST]
    dcode, dconsts = M._derivative(code, consts, 1, 4)
    ins_g, sides_g = [x, a, wt, b, up], sides + [P.ROW]
    knobs: List[int] = []

    def per_edge():
        dk = ops.message_edges(rowptr, col, perm, ins_g, sides_g, dcode, dconsts, F, F, False, knobs, [], None)
        return dk.mm(wt.t()), a.t().mm(dk), dk.sum(0, keepdim=True)

    def accumulate():
        return ops.message_encoder_grad(rowptr, col, perm, ins_g, sides_g, dcode, dconsts, F, 1, True, knobs)

    a_slot = ops.slot_rows(a, perm)
    sides_s = [P.COL, P.ENCS, P.CONST, P.CONST]
    ins_s = [x, a_slot, wt, b, up]

    def accumulate_slot():
        return ops.message_encoder_grad(rowptr, col, perm, ins_s, sides_s + [P.ROW], dcode, dconsts, F, 1, True, knobs)

    leaves = [t.clone().requires_grad_() for t in (x, a, wt, b)]
    leaves_s = [t.clone().requires_grad_() for t in (x, a_slot, wt, b)]

    def whole(mode, slot=False):
        def fn():
            M.ENCODER_GRAD = mode
            ls, sd = (leaves_s, sides_s) if slot else (leaves, sides)
            with torch.enable_grad():
                out = ops.message_reduce(rowptr, col, perm, ls, sd, code, consts, F, "sum", knobs, [], None)[0]
            return torch.autograd.grad(out, ls, up)
        return fn

    codegen.reset()
    interp = accumulate()  # the interpreter
    t0 = time.perf_counter()
    ok = [codegen.prepare(ins_g, sides_g, dcode, dconsts, F, "sum", rowptr.dtype, force=True, op="edges",
                          out_width=F),
          codegen.prepare(ins_g, sides_g, dcode, dconsts, F, "sum", rowptr.dtype, force=True, op="encgrad",
                          out_width=F, enc=1, need_features=True),
          codegen.prepare(leaves, sides, code, consts, F, "sum", rowptr.dtype, force=True),
          codegen.prepare(ins_s, sides_s + [P.ROW], dcode, dconsts, F, "sum", rowptr.dtype, force=True, op="encgrad",
                          out_width=F, enc=1, need_features=True),
          codegen.prepare(leaves_s, sides_s, code, consts, F, "sum", rowptr.dtype, force=True)]
    prepare_s = time.perf_counter() - t0
    if not all(ok):
        raise RuntimeError("codegen_encoder --backward: no generated kernel (no C++ compiler?)")
    calls = codegen.calls()
    fused, old, fused_s = accumulate(), per_edge(), accumulate_slot()
    if codegen.calls() != calls + 3:
        raise RuntimeError("codegen_encoder --backward: the generated kernels did not run")
    bits = all(torch.equal(u.view(torch.int32), v.view(torch.int32)) for u, v in zip(fused, interp))
    slot_bits = all(torch.equal(u.view(torch.int32), v.view(torch.int32))
                    for u, v in zip((fused[0].index_select(0, perm), fused[1], fused[2]), fused_s))
    diffs = [float(((u - v).abs().max() / v.abs().max().clamp(min=1e-30))) for u, v in zip(fused, old)]
    w_old, w_new, w_slot = whole("per_edge")(), whole("accumulate")(), whole("accumulate", True)()
    whole_slot_bits = all(torch.equal(u.view(torch.int32), v.view(torch.int32)) for u, v in
                          zip((w_new[0], w_new[1].index_select(0, perm), w_new[2], w_new[3]), w_slot))
    whole_diffs = [float(((u - v).abs().max() / v.abs().max().clamp(min=1e-30))) for u, v in zip(w_new, w_old)]
    agreement = {"accumulate_generated_vs_interpreter_bitwise": bits,
                 "accumulate_slot_vs_accumulate_bitwise": slot_bits,
                 "backward_slot_vs_accumulate_bitwise": whole_slot_bits,
                 "accumulate_vs_per_edge_max_rel_diff_da_dwt_db": diffs,
                 "backward_accumulate_vs_per_edge_max_rel_diff_x_a_wt_b": whole_diffs}
    if not bits or not slot_bits or not whole_slot_bits or max(diffs + whole_diffs) > 1e-3:
        raise RuntimeError(f"codegen_encoder --backward: results differ {agreement}")
    del fused, old, interp, w_old, w_new, fused_s, w_slot

    def interp_mode():
        codegen.suspend()

    times = _rounds({"per_edge": (codegen.resume, per_edge), "accumulate": (codegen.resume, accumulate),
                     "accumulate_interp": (interp_mode, accumulate),
                     "accumulate_slot": (codegen.resume, accumulate_slot)}, rounds)
    whole_times = _rounds({"per_edge": (codegen.resume, whole("per_edge")),
                           "accumulate": (codegen.resume, whole("accumulate")),
                           "accumulate_slot": (codegen.resume, whole("accumulate", True))}, rounds)
    codegen.resume()
    peaks = {"encoder_grads": {}, "backward": {}}
    for name, fn in (("per_edge", per_edge), ("accumulate", accumulate)):
        peaks["encoder_grads"][name] = statistics.median(_common.read_peak_rss_delta(fn) for _ in range(3))
        peaks["backward"][name] = statistics.median(_common.read_peak_rss_delta(whole(name)) for _ in range(3))
    M.ENCODER_GRAD = "accumulate"
    codegen.reset()
    return {"N": N, "E": E, "F": F, "D": D, "dtype": "float32", "prepare_in_process_s": prepare_s,
            "agreement": agreement, "encoder_grads": _summary(times, "per_edge"),
            "backward": _summary(whole_times, "per_edge"), "peak_rss_delta_bytes": peaks,
            "E_x_F_x_4_bytes": E * F * 4}


def markdown_backward(p: dict) -> str:
    r = p["result"]
    mib = 1 << 20
    lines = [f"# An edge encoder's gradients without an E x F tensor (`{p['command']}`)", "",
             f"CPU: {p['cpu']}, {p['threads']} threads; {r['N']:,} nodes / {r['E']:,} edges power-law, "
             f"F = {r['F']}, D = {r['D']}, {r['dtype']}; compiler: {p['compiler']}; flags: {' '.join(p['flags'])}. "
             f"{_common.load_text(p['loadavg_before_after'])}.", "",
             "Program: the backward of the sum over every row of relu(x_j + lin(a_e)), lin(a_e) = b + a_e @ Wt; "
             f"an [E, F] float32 tensor is {r['E_x_F_x_4_bytes'] / mib:.0f} MiB.", "",
             "Agreement (checked before timing): " + ", ".join(f"{k} = {v}" for k, v in r["agreement"].items()) + ".",
             ""]
    for part, title in (("encoder_grads", "the encoder's gradients alone (da, dWt, db)"),
                        ("backward", "the whole backward (x, a, Wt, b)")):
        lines += [f"## {title}", "", "| variant | median ms | min ms | ratio to per_edge (median of rounds) | "
                  "peak RSS added MiB |", "|---|---|---|---|---|"]
        for k, v in r[part].items():
            peak = r["peak_rss_delta_bytes"][part].get(k)
            lines.append(f"| {k} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['ratio_to_per_edge']:.2f}x | "
                         + (f"{peak / mib:.0f} |" if peak is not None else "- |"))
        lines.append("")
    return "\n".join(lines)


def markdown(p: dict) -> str:
    r = p["result"]
    lines = [f"# An edge encoder inside a generated message kernel (`{p['command']}`)", "",
             f"CPU: {p['cpu']}, {p['threads']} threads; {r['N']:,} nodes / {r['E']:,} edges power-law, "
             f"F = {r['F']}, D = {r['D']}, {r['dtype']}; compiler: {p['compiler']}; flags: {' '.join(p['flags'])}. "
             f"{_common.load_text(p['loadavg_before_after'])}.", "",
             "Program: the forward sum over every row of relu(x_j + lin(a_e)), lin(a_e) = b + a_e @ Wt." +
             ("" if not p.get("env") else " Environment: " + ", ".join(f"{k}={v}" for k, v in p["env"].items())
              + "."), "",
             "Agreement (checked before timing): " + ", ".join(f"{k} = {v}" for k, v in r["agreement"].items()) + ".",
             "", "| variant | median ms | min ms | ratio to spmm (median of rounds) |", "|---|---|---|---|"]
    for k, v in r["forward_sum"].items():
        lines.append(f"| {k} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['ratio_to_spmm']:.2f}x |")
    gen = r["forward_sum"]["generated"]["ratio_to_spmm"]
    lines += ["", f"Generated (encoder inside) / spmm of x_j = {gen:.2f} (issue 25's target: within 1.5x)."]
    fs = r["forward_sum"]
    if "generated_slot" in fs:
        lines.append(f"Edge features in CSR slot order (a copy a[perm], enc_slot): the kernel "
                     f"{fs['generated_slot']['median_ms']:.1f} ms ({fs['generated_slot']['ratio_to_spmm']:.2f}x), with "
                     f"the cache's lookup {fs['generated_slot_cached']['ratio_to_spmm']:.2f}x (check 'off') / "
                     f"{fs['generated_slot_checked']['ratio_to_spmm']:.2f}x (check 'cpu', the fingerprint), a fresh "
                     f"copy every call {fs['generated_slot_fresh']['ratio_to_spmm']:.2f}x; through perm "
                     f"{fs['generated']['ratio_to_spmm']:.2f}x.")
    if "generated_edge_by_edge" in fs:
        lines.append(f"Before the encoder went by blocks of edges (the same run): "
                     f"{fs['generated_edge_by_edge']['ratio_to_spmm']:.2f}x.")
    if "gather_only" in fs and "matvec_only" in fs:
        lines.append(f"Floors (not results: kernels that leave a part out): the gather and walk without the "
                     f"mat-vec {fs['gather_only']['ratio_to_spmm']:.2f}x, the mat-vec without memory "
                     f"{fs['matvec_only']['ratio_to_spmm']:.2f}x the spmm.")
    if "x_row0" in fs:
        ms = {k: v["median_ms"] for k, v in fs.items()}
        walk = ms["walk_only"]
        lines.append(f"Taken apart (medians less walk_only's {walk:.1f} ms, the allocation and row walk all pay): "
                     f"generated {ms['generated'] - walk:.1f} ms; without the x_j gather (x_row0) "
                     f"{ms['x_row0'] - walk:.1f}; the gather alone (gather_only) {ms['gather_only'] - walk:.1f}; the "
                     f"gather's prefetches issued but never read (x_row0_prefetched) {ms['x_row0_prefetched'] - walk:.1f}"
                     + (f"; one_pass {ms['one_pass'] - walk:.1f} ({fs['one_pass']['ratio_to_spmm']:.2f}x the spmm)"
                        if "one_pass" in ms else "") + ".")
    lines.append("")
    return "\n".join(lines)


def _allocator_env() -> dict:
    """The allocator settings of this run that change the figures (GLIBC_TUNABLES=glibc.malloc.hugetlb=1:
    transparent huge pages for the tensors, fewer TLB misses on the random reads)."""
    return {k: os.environ[k] for k in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_") if k in os.environ}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k nodes / 100k edges, fewer rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dim", type=int, default=16, help="D, the edge features")
    ap.add_argument("--backward", action="store_true", help="the encoder's gradients: per edge vs accumulated")
    ap.add_argument("--overlap", action="store_true", help="add the kernels that take the gather and the "
                    "arithmetic apart (walk_only, x_row0, x_row0_prefetched, one_pass)")
    ap.add_argument("--nodes", type=int, default=None, help="N (default 100k, 10k with --quick); 10 N edges")
    ap.add_argument("--only", default="", help="comma-separated forward variants to time (spmm always)")
    ap.add_argument("--out", default=None, help="the results' file name (without .json / .md); default "
                    "codegen_encoder[_backward][_quick]")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    N = args.nodes or (10_000 if args.quick else 100_000)
    rounds = 5 if args.quick else args.rounds
    load0 = _common.loadavg()
    if args.backward:
        res = run_backward(N, 128, args.dim, rounds)
        payload = {"command": _common.command("codegen_encoder", argv), "cpu": _common.cpu_model(),
                   "threads": args.threads, "machine": _common.machine(),
                   "compiler": build._compiler_identity(build.compiler()),
                   "flags": build.module_flags() + list(build.BASE_FLAGS), "result": res,
                   "loadavg_before_after": [load0, _common.loadavg()]}
        _common.write_results(_common.RESULTS, args.out or "codegen_encoder_backward" + ("_quick" if args.quick else ""),
                              payload,
                              markdown_backward)
        return 0
    res = run(N, 128, args.dim, rounds, overlap=args.overlap, only=tuple(v for v in args.only.split(",") if v))
    payload = {"command": _common.command("codegen_encoder", argv), "cpu": _common.cpu_model(),
               "threads": args.threads, "machine": _common.machine(), "env": _allocator_env(),
               "compiler": build._compiler_identity(build.compiler()),
               "flags": build.module_flags() + list(build.BASE_FLAGS), "result": res,
               "loadavg_before_after": [load0, _common.loadavg()]}
    _common.write_results(_common.RESULTS, args.out or ("codegen_encoder_quick" if args.quick else "codegen_encoder"),
                          payload,
                          markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
