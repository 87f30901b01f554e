"""The CUDA target of the emitter (gnncompile/codegen/cuda.py): the generated kernels of the test
programs (every opcode as a message_sum_multi result, every reduce, message_edges in both orders
and output classes, int32 / int64, a per-slot input read through ``slot``, edge encoders of every
width class, float32 and float64)
compile with nvcc alone: the torch-free native/cuda/codegen_abi.cuh and common.cuh, no torch
header, warnings as errors. No GPU here: running them is the GPU issue's; their expressions are
the CPU target's, tested bit for bit in the other files of this folder."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gnncompile import codegen
from gnncompile.codegen import cuda
from gnncompile.ops import program as P

ROOT = Path(__file__).resolve().parents[2]
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def test_generated_cuda_source_is_torch_free_and_one_kernel_per_program():
    programs = cuda.test_programs()
    src = cuda.test_source()
    assert len({name for name, _ in programs}) == len(programs)
    assert src.count('extern "C" __global__') == len(programs)
    assert "torch" not in src and "ATen" not in src and "std::" not in src
    assert {s.op for _, s in programs} == {"reduce", "multi", "edges"}
    assert {s.reduce for _, s in programs if s.op == "reduce"} == {0, 1, 2, 3}
    assert {s.dtype for _, s in programs} == {"float32", "float64"}
    covered = {int(c) for _, s in programs for c in s.code[0::P.INSTR]}
    assert covered == set(P.OPS)  # every opcode
    # edge encoders of every width class and op, D unrolled and looped; products never fused
    enc = [s for _, s in programs if P.ENC in s.sides]
    assert {s.kinds[s.sides.index(P.ENC)] for s in enc} == {"f", "g", "s"}
    assert {s.op for s in enc} == {"reduce", "multi", "edges"}
    assert {s.dtype for s in enc} == {"float32", "float64"}
    assert "__fmul_rn(" in src and "__dmul_rn(" in src and "for (int d = 0; d < 33; ++d)" in src
    nan = codegen.make_spec(*P.encode(P.node("mul", P.inp(0), P.const(float("nan")))), [P.COL], [8], 8, "sum",
                            torch.float32, torch.int64)
    assert "__longlong_as_double" in cuda.emit_cuda(nan)
    with pytest.raises(ValueError, match="C identifier"):
        cuda.emit_cuda(nan, "not a name")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
def test_generated_cuda_kernels_compile_with_nvcc(tmp_path):
    src = tmp_path / "generated.cu"
    src.write_text(cuda.test_source())
    argv = [NVCC, "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-Xcompiler",
            "-Wall,-Wextra", "-Werror", "all-warnings", "-I", str(ROOT / "native"),
            "-gencode", "arch=compute_80,code=sm_80", "-c", str(src), "-o", str(tmp_path / "generated.o")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "generated.o").stat().st_size > 0
