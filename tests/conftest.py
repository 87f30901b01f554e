"""Shared fixtures for the gnncompile op tests.

The oracle for ``spmm`` is PyG's own expression,

    torch_geometric.utils.scatter(x[edge_index[0]] * w, edge_index[1], dim=0,
                                  dim_size=num_dst, reduce=reduce)

evaluated in float32 (float64 for float64 inputs) on the *same* rounded 16-bit inputs, so the
only difference left for float16 / bfloat16 is the single rounding of the output.
Helpers are exposed as session-scoped fixtures so that hypothesis tests can use them too.
"""
from __future__ import annotations

import os

# The suite compiles many models: use the aot_eager inner compiler unless told otherwise, the same
# for every test whatever its graph size (the default, 'auto', gives graphs of 600k nodes + edges
# and more to inductor, which code-generates every graph piece and would multiply the suite's
# time). tests/compiler/test_compile.py checks the inductor path and tests/passes/test_hoist.py
# the 'auto' rule explicitly.
os.environ.setdefault("GNNCOMPILE_INNER", "aot_eager")
# Message programs everywhere: the suite's graphs are small, where the default ('auto') leaves
# them as written (passes.match.programs_pay); tests/passes/test_program_rule.py tests 'auto'.
os.environ.setdefault("GNNCOMPILE_PROGRAMS", "always")
# The rewritten form always: the speed guard would run the unrewritten form on half of a
# model's first calls and keep whichever was faster, which tests of the fused ops cannot
# predict; tests/compiler/test_guard.py tests the guard.
os.environ.setdefault("GNNCOMPILE_GUARD", "off")
# Edge encoders inside the message programs wherever they can go: the default ('auto') keeps an
# encoder whose input features need a gradient outside, and the tests of the kernels' encoder
# path give their edge features a gradient; tests/passes/test_encoder_rule.py tests 'auto'.
os.environ.setdefault("GNNCOMPILE_EDGE_ENCODER", "inside")
# gnncompile's own spmm kernel everywhere: 'auto' would time it against torch.sparse.mm at the
# first compile of each size class and cache the result in the user's profile folder, and which
# one wins depends on the machine; tests/compiler/test_portfolio.py tests 'auto'.
os.environ.setdefault("GNNCOMPILE_SPMM_IMPL", "native")
# No A/B check of a transferred profile at compile time (a child process training for up to two
# minutes): a profile of another device in the cache is used only with a cached verdict;
# tests/profiles/test_transfer.py tests the check.
os.environ.setdefault("GNNCOMPILE_TRANSFER", "cached")
# The interpreter for message programs: the default ('auto') compiles a C++ kernel per distinct
# program and op at first use (a few tenths of a second each), and the suite runs hundreds of
# programs (fuzzed ones too) whose numbers are the same either way; tests/codegen tests 'auto'
# (bit for bit against the interpreter) with config.override.
os.environ.setdefault("GNNCOMPILE_CODEGEN", "off")
# pytest-xdist: each worker gets its share of the cores for torch's intra-op threads, and passes
# it on to the processes its tests start. Two workers of two threads each on two cores spend much
# of their time spin-waiting on each other (measured, the whole suite on 2 cores: 19.1 -> 15.6 min
# wall, 32.7 -> 28.1 min of user CPU time). Tests of multi-threaded kernels set their thread
# counts themselves.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_THREAD_SHARE = None
if _XDIST_WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _THREAD_SHARE = max(1, (os.cpu_count() or 1) // _XDIST_WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_THREAD_SHARE)

import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Optional

import pytest
import torch

import gnncompile

if _THREAD_SHARE is not None:  # in case torch was imported before this file
    torch.set_num_threads(_THREAD_SHARE)

with warnings.catch_warnings():
    # PyG imports emit deprecation warnings from torch.jit on recent torch; they are not ours.
    warnings.simplefilter("ignore")
    import torch_geometric  # noqa: F401
    from torch_geometric.utils import scatter as pyg_scatter
    from torch_geometric.utils import softmax as pyg_softmax

REDUCES = ("sum", "mean", "max", "min")
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int64, torch.int32)

# Relative / absolute tolerances per feature dtype, applied to a float32 (float64) expected value.
# 16-bit outputs are rounded once from a float32 accumulator: half an ulp is 2^-11 (fp16) and
# 2^-8 (bf16) relative; allow twice that.
TOLERANCES = {
    torch.float64: dict(rtol=1e-10, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-4),
    torch.bfloat16: dict(rtol=8e-3, atol=1e-3),
}


def available_devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and gnncompile.info()["cuda_kernels"]:
        devs.append("cuda")
    return devs


DEVICES = available_devices()


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def weight_view(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-edge weight against the gathered messages x[src] of shape [E, *]."""
    if w.dim() == 2 and w.size(1) > 1:  # [E, H] with x [N, H, C]
        assert x.dim() == 3 and x.size(1) == w.size(1)
        return w.unsqueeze(-1)
    return w.reshape(w.size(0), *([1] * (x.dim() - 1)))


def expected_spmm(edge_index: torch.Tensor, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
                  reduce: str = "sum", num_dst: Optional[int] = None, *, upcast: bool = True) -> torch.Tensor:
    """PyG semantics, computed in float32 for 16-bit inputs (or in x.dtype with upcast=False)."""
    if num_dst is None:
        num_dst = x.size(0)
    src, dst = edge_index[0].long(), edge_index[1].long()
    xe = x.to(acc_dtype(x.dtype)) if upcast else x
    msg = xe[src]
    if edge_weight is not None:
        we = edge_weight.to(xe.dtype) if upcast else edge_weight
        msg = msg * weight_view(we, xe)
    return pyg_scatter(msg, dst, dim=0, dim_size=num_dst, reduce=reduce)


def expected_softmax(edge_index: torch.Tensor, scores: torch.Tensor, num_dst: Optional[int] = None,
                     *, upcast: bool = True) -> torch.Tensor:
    s = scores.to(acc_dtype(scores.dtype)) if upcast else scores
    return pyg_softmax(s, edge_index[1].long(), num_nodes=num_dst)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: Optional[torch.dtype] = None,
                 msg: str = "") -> None:
    """actual (any float dtype) against a float32/float64 expected, tolerance by `dtype`."""
    dtype = dtype or actual.dtype
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)} {msg}"
    torch.testing.assert_close(actual.to(expected.dtype), expected, **TOLERANCES[dtype],
                               msg=lambda m: f"{m}\n{msg}")


def random_graph(num_src: int, num_edges: int, num_dst: Optional[int] = None, *,
                 index_dtype: torch.dtype = torch.int64, generator: Optional[torch.Generator] = None,
                 device="cpu", unique: bool = False) -> torch.Tensor:
    """[2, E] edge_index with sources in [0, num_src) and destinations in [0, num_dst)."""
    if num_dst is None:
        num_dst = num_src
    if unique:  # no duplicate (src, dst) pairs: max/min gradients have no ties
        num_edges = min(num_edges, num_src * num_dst)
        pick = torch.randperm(num_src * num_dst, generator=generator)[:num_edges]
        ei = torch.stack([pick // num_dst, pick % num_dst])
    else:
        ei = torch.stack([
            torch.randint(0, max(num_src, 1), (num_edges,), generator=generator),
            torch.randint(0, max(num_dst, 1), (num_edges,), generator=generator),
        ])
    return ei.to(index_dtype).to(device)


def make_weight(mode: str, E: int, H: int, dtype: torch.dtype, generator=None, device="cpu"):
    """mode: 'none', 'edge' ([E]) or 'head' ([E, H])."""
    if mode == "none":
        return None
    shape = (E,) if mode == "edge" else (E, H)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).to(device)


def make_x(mode: str, N: int, H: int, C: int, dtype: torch.dtype, generator=None, device="cpu"):
    """x is [N, H, C] for per-head weights, [N, F=H*C] otherwise."""
    shape = (N, H, C) if mode == "head" else (N, H * C)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).to(device)


class Helpers:
    REDUCES = REDUCES
    FLOAT_DTYPES = FLOAT_DTYPES
    INDEX_DTYPES = INDEX_DTYPES
    TOLERANCES = TOLERANCES
    expected_spmm = staticmethod(expected_spmm)
    expected_softmax = staticmethod(expected_softmax)
    assert_close = staticmethod(assert_close)
    random_graph = staticmethod(random_graph)
    make_weight = staticmethod(make_weight)
    make_x = staticmethod(make_x)
    weight_view = staticmethod(weight_view)
    acc_dtype = staticmethod(acc_dtype)
    pyg_scatter = staticmethod(pyg_scatter)
    pyg_softmax = staticmethod(pyg_softmax)


@pytest.fixture(scope="session")
def h() -> Helpers:
    """Test helpers (oracles, tolerances, graph builders)."""
    return Helpers()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def fresh_cache():
    """An empty structure cache with zeroed counters (restored empty afterwards)."""
    gnncompile.ops.structure.clear_cache()
    yield gnncompile.ops.structure.CACHE
    gnncompile.ops.structure.clear_cache()


@pytest.fixture
def build_host_harness(tmp_path):
    """build(source) compiles a C++ program against native/ (-I native) with the host compiler
    and returns its path; the test is skipped when there is no host compiler."""
    cxx = next((shutil.which(n) for n in (os.environ.get("CXX"), "c++", "g++", "clang++")
                if n and shutil.which(n)), None)
    if cxx is None:
        pytest.skip("no host C++ compiler to build the harness")
    native_dir = Path(__file__).resolve().parents[1] / "native"

    def build(source: str) -> Path:
        src, exe = tmp_path / "harness.cpp", tmp_path / "harness"
        src.write_text(source)
        subprocess.run([cxx, "-std=c++17", "-O1", "-I", str(native_dir), str(src), "-o", str(exe)],
                       check=True, capture_output=True, text=True)
        return exe

    return build


@pytest.fixture
def native():
    """The compiled kernels; tests comparing them with the reference need them loaded."""
    info = gnncompile.info()
    if not info["native"]:
        pytest.skip(f"native kernels not loaded: {info['native_error']}")
    return gnncompile.ops._native._C


def pytest_report_header(config):
    info = gnncompile.info()
    return (f"gnncompile {info['version']} from {gnncompile.__file__}: native={info['native']} "
            f"({info['native_error']}), cuda_kernels={info['cuda_kernels']}, torch {info['torch']}")


# ----------------------------------------------------------------------------- slow marks
_SLOW_LIST = Path(__file__).with_name("slow.txt")


def _slow_ids():
    out = set()
    for line in _SLOW_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            out.add(line.split("\t", 1)[1].strip())
    return out


def pytest_collection_modifyitems(session, config, items):
    """Marks the tests listed in tests/slow.txt slow (see tests/slow_list.py). When the whole
    suite is collected, a listed test that no longer exists is an error: the list must not go
    stale silently."""
    listed = _slow_ids()
    rootdir = Path(str(config.rootpath))
    seen = set()
    for item in items:
        node = item.nodeid
        if node in listed:
            item.add_marker(pytest.mark.slow)
            seen.add(node)
    whole = not config.args or [Path(a).resolve() for a in config.args] == [rootdir / "tests"]
    if whole and not config.getoption("-k") and not config.getoption("-m") and listed - seen:
        missing = sorted(listed - seen)
        raise pytest.UsageError(f"tests/slow.txt lists {len(missing)} test(s) that do not exist: {missing[:5]}")
