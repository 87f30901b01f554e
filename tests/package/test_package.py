"""Packaging: info(), the tuner subpackage, and the pure-torch fallback without native kernels."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gnncompile

# process-level tests (subprocesses, servers, whole runs): `make test` runs them, `make test-fast`
# does not (tests/slow_list.py)
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def _installed_extension() -> bool:
    """Was the compiled module gnncompile._C built for this installation (a wheel ships it; an
    editable install finds it in its build tree)?"""
    try:
        importlib.metadata.distribution("gnncompile")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("gnncompile._C") is not None


NATIVE_EXPECTED = _installed_extension() and os.environ.get("GNNCOMPILE_DISABLE_NATIVE", "") in ("", "0")


def _env(**extra):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # test the installation, not a path someone prepended
    env.pop("GNNCOMPILE_DISABLE_NATIVE", None)
    env.update(extra)
    return env


def _run(code: str, cwd, **env):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"subprocess failed (cwd={cwd}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_info_keys_and_types():
    info = gnncompile.info()
    for key, typ in (("version", str), ("torch", str), ("native", bool), ("cuda_kernels", bool),
                     ("device", str)):
        assert key in info, key
        assert isinstance(info[key], typ), (key, info[key])
    assert info["version"] == gnncompile.__version__ == importlib.metadata.version("gnncompile")
    assert info["torch"] == torch.__version__
    assert info["device"]
    if not torch.cuda.is_available():
        assert info["cuda_kernels"] is False


def test_native_loaded_in_this_process():
    info = gnncompile.info()
    if not NATIVE_EXPECTED:
        pytest.skip("the installation has no compiled gnncompile._C")
    assert info["native"] is True, (
        f"gnncompile was imported from {gnncompile.__file__} and did not load its native kernels "
        f"({info['native_error']}); the tests in this run exercise only the reference fallback")
    assert info["native_error"] is None
    assert torch._C._dispatch_has_kernel_for_dispatch_key("gnncompile::spmm", "CPU")


@pytest.mark.parametrize("where", ["tmp", "repo_root"])
def test_native_loads_whatever_the_working_directory(tmp_path, where):
    """`import gnncompile` must find its compiled module from anywhere, the checkout included."""
    if not NATIVE_EXPECTED:
        pytest.skip("the installation has no compiled gnncompile._C")
    cwd = tmp_path if where == "tmp" else REPO_ROOT
    out = _run("""
        import json, warnings
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            import gnncompile
        info = gnncompile.info()
        print(json.dumps({"file": gnncompile.__file__, "native": info["native"],
                          "error": info["native_error"],
                          "runtime_warnings": [str(w.message) for w in rec
                                               if issubclass(w.category, RuntimeWarning)]}))
    """, cwd)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["native"] is True, f"from cwd={cwd}: imported {res['file']}, native error: {res['error']}"
    assert res["runtime_warnings"] == []


def test_tuner_is_a_subpackage():
    import gnncompile.tuner as tuner

    assert tuner.__name__ == "gnncompile.tuner"
    assert importlib.util.find_spec("gnncompile.tuner") is not None


def test_no_top_level_tuner_module(tmp_path):
    """tuner/ sits at the top of the repository but must install only as gnncompile.tuner."""
    out = _run("""
        import importlib.util, json
        spec = importlib.util.find_spec("tuner")
        import gnncompile.tuner
        print(json.dumps({"tuner": None if spec is None else str(spec.origin),
                          "sub": gnncompile.tuner.__name__}))
    """, tmp_path)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["sub"] == "gnncompile.tuner"
    assert res["tuner"] is None, f"a top-level `tuner` is importable from {res['tuner']}"


FALLBACK_SCRIPT = """
import json, warnings
with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    import gnncompile
    from gnncompile.ops import spmm, edge_softmax
    import gnncompile.ops.structure, gnncompile.ops.schemas  # no second warning on more imports
runtime = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]

import torch

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.utils import scatter, softmax

res = {"runtime_warnings": runtime, "native": gnncompile.info()["native"],
       "cpu_kernel": torch._C._dispatch_has_kernel_for_dispatch_key("gnncompile::spmm", "CPU")}
g = torch.Generator().manual_seed(0)
N, E = 9, 40
src = torch.randint(0, N, (E,), generator=g)
dst = torch.randint(0, N - 1, (E,), generator=g)  # node N-1 isolated
ei = torch.stack([src, dst])
x = torch.randn(N, 2, 3, generator=g, dtype=torch.float64)
w = torch.randn(E, 2, generator=g, dtype=torch.float64)
errs = {}
for reduce in ("sum", "mean", "max", "min"):
    for mode in ("none", "edge", "head"):
        ww = None if mode == "none" else (w[:, 0] if mode == "edge" else w)
        for index_dtype in (torch.int64, torch.int32):
            x1 = x.clone().requires_grad_()
            w1 = None if ww is None else ww.clone().requires_grad_()
            out = spmm(ei.to(index_dtype), x1, w1, reduce=reduce)
            x2 = x.clone().requires_grad_()
            w2 = None if ww is None else ww.clone().requires_grad_()
            msg = x2[src]
            if w2 is not None:
                msg = msg * (w2.view(E, 1, 1) if w2.dim() == 1 else w2.unsqueeze(-1))
            exp = scatter(msg, dst, dim=0, dim_size=N, reduce=reduce)
            go = torch.randn(out.shape, generator=g, dtype=torch.float64)
            ps1 = [x1] + ([w1] if w1 is not None else [])
            ps2 = [x2] + ([w2] if w2 is not None else [])
            d = [(out - exp).abs().max().item()]
            d += [(a - b).abs().max().item() for a, b in zip(torch.autograd.grad(out, ps1, go),
                                                             torch.autograd.grad(exp, ps2, go))]
            errs[f"spmm-{reduce}-{mode}-{index_dtype}"] = max(d)
s = torch.randn(E, 2, generator=g, dtype=torch.float64)
s1, s2 = s.clone().requires_grad_(), s.clone().requires_grad_()
a, b = edge_softmax(ei, s1, num_dst=N), softmax(s2, dst, num_nodes=N)
go = torch.randn(E, 2, generator=g, dtype=torch.float64)
errs["softmax"] = max((a - b).abs().max().item(),
                      (torch.autograd.grad(a, s1, go)[0] - torch.autograd.grad(b, s2, go)[0]).abs().max().item())
res["errs"] = errs
try:
    spmm(torch.tensor([[0, 1], [1, 9]]), x)
    res["bad_input"] = "no error"
except IndexError as e:
    res["bad_input"] = "IndexError: " + str(e)
res["good_after_bad"] = bool(torch.allclose(spmm(ei, x), scatter(x[src], dst, dim=0, dim_size=N)))
print(json.dumps(res))
"""


def test_fallback_without_native_kernels(tmp_path):
    out = _run(FALLBACK_SCRIPT, tmp_path, GNNCOMPILE_DISABLE_NATIVE="1")
    res = json.loads(out.strip().splitlines()[-1])
    assert len(res["runtime_warnings"]) == 1, res["runtime_warnings"]
    warning = res["runtime_warnings"][0]
    assert "native kernels are not available" in warning
    assert "GNNCOMPILE_DISABLE_NATIVE" in warning and "pure-torch reference" in warning
    assert res["native"] is False
    assert res["cpu_kernel"] is False  # really dispatching to the reference
    bad = {k: v for k, v in res["errs"].items() if not v < 1e-10}
    assert not bad, f"fallback results or gradients differ from PyG: {bad}"
    assert len(res["errs"]) == 4 * 3 * 2 + 1
    assert res["bad_input"].startswith("IndexError: edge_index[1] (destination) holds index 9")
    assert res["good_after_bad"] is True


def test_import_is_silent_with_native_kernels(tmp_path):
    if not NATIVE_EXPECTED:
        pytest.skip("the installation has no compiled gnncompile._C")
    _run("import gnncompile, gnncompile.ops, gnncompile.ops.structure", tmp_path, PYTHONWARNINGS="error::RuntimeWarning")


def test_import_does_not_import_optuna_or_the_tuner(tmp_path):
    """The tuner is an optional extra: `import gnncompile` (and compile/export) must work without
    optuna, so it must not import it."""
    out = _run("""
        import json, sys
        import gnncompile
        print(json.dumps({m: m in sys.modules for m in ("optuna", "gnncompile.tuner", "onnx")}))
    """, tmp_path)
    res = json.loads(out.strip().splitlines()[-1])
    assert res == {"optuna": False, "gnncompile.tuner": False, "onnx": False}, res


def _editable_install() -> bool:
    try:
        text = importlib.metadata.distribution("gnncompile").read_text("direct_url.json") or "{}"
    except importlib.metadata.PackageNotFoundError:
        return False
    return bool(json.loads(text).get("dir_info", {}).get("editable"))


def test_editable_install_imports_the_checkout(tmp_path):
    """With `pip install -e .`, Python sources are imported from the checkout: a module added or
    edited there takes effect in the next process, without reinstalling."""
    if not _editable_install():
        pytest.skip("gnncompile is not installed editable")
    pkg = Path(gnncompile.__file__).resolve().parent
    assert pkg == REPO_ROOT / "gnncompile"
    probe = pkg / f"_editable_probe_{os.getpid()}.py"
    code = f"from gnncompile import {probe.stem} as p; print(p.VALUE)"
    try:
        probe.write_text("VALUE = 1\n")
        assert _run(code, tmp_path).strip().splitlines()[-1] == "1"
        probe.write_text("VALUE = 2\n")
        assert _run(code, tmp_path).strip().splitlines()[-1] == "2"
    finally:
        probe.unlink(missing_ok=True)
    tuner = _run("import gnncompile.tuner as t; print(t.__file__)", tmp_path).strip().splitlines()[-1]
    assert Path(tuner).resolve() == REPO_ROOT / "tuner" / "__init__.py"
