"""The encoder benchmark's --overlap kernels (benchmarks/codegen_encoder.py): they build from the
generated source, run under the encoder's key, and the hand-written one_pass kernel (the mat-vec,
x_j, the relu and the row sums in one function, rows crossing blocks) equals the interpreter bit
for bit on a power-law graph with empty rows and hubs; the table's "taken apart" line reads the run."""
from __future__ import annotations

import pytest
import torch

from benchmarks import codegen_encoder
from gnncompile import codegen, config
from gnncompile.codegen import build
from gnncompile.ops import _native

pytestmark = pytest.mark.skipif(not _native.native_loaded() or build.shutil.which("c++") is None,
                                reason="needs the native module and a C++ compiler")


def test_overlap_kernels_run_and_one_pass_is_bit_equal(tmp_path):
    codegen.reset()
    try:
        with config.override(codegen="auto", cache_dir=tmp_path):
            r = codegen_encoder.run(3000, 128, 16, 1, overlap=True)
    finally:
        codegen.reset()
    assert r["agreement"]["one_pass_vs_interpreter_bitwise"] is True
    fs = r["forward_sum"]
    assert {"spmm", "generated", "walk_only", "x_row0", "x_row0_prefetched", "one_pass"} <= set(fs)
    md = codegen_encoder.markdown({"command": "python -m benchmarks codegen_encoder --overlap", "cpu": "cpu",
                                   "threads": 2, "compiler": "c++", "flags": ["-O3"], "result": r,
                                   "loadavg_before_after": [[0.0], [0.0]]})
    walk = fs["walk_only"]["median_ms"]
    assert f"generated {fs['generated']['median_ms'] - walk:.1f} ms" in md
    assert f"one_pass {fs['one_pass']['median_ms'] - walk:.1f}" in md


def test_one_pass_kernel_is_refused_off_its_shape(tmp_path):
    # one_pass is written for F = 128, D = 16, float32, int64 indices: other shapes get no such kernel
    from gnncompile.ops import program as P
    code, consts = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    ins = [torch.zeros(4, 64), torch.zeros(6, 16), torch.zeros(16, 64), torch.zeros(1, 64)]
    with config.override(codegen="auto", cache_dir=tmp_path):
        ks = codegen_encoder.overlap_kernels(ins, [P.COL, P.ENC, P.CONST, P.CONST], code, consts, 64, torch.int64)
    assert set(ks) == {"walk_only", "x_row0", "x_row0_prefetched"}
    assert all(isinstance(v, int) and v != 0 for v in ks.values())
