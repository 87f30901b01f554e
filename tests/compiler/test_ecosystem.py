"""gnncompile in the PyTorch ecosystem (issue 14, points 13-15 and Lightning).

* A compiled model as another module's child: the parent's state_dict keys and named_* names
  equal those with the uncompiled model in its place; checkpoints (model and optimizer) move
  both ways between the two, nested compiled modules included.
* ``torch.compile(model, backend="gnncompile")`` in a process that never imports gnncompile
  (the ``torch_dynamo_backends`` entry point).
* ``torch.save(gnncompile.compile(model))`` and ``torch.load`` in a fresh process.
* A compiled GCN inside a LightningModule trains, checkpoints, restores and resumes.
"""
from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import gnncompile
from gnncompile.compiler import CompiledModule, make_backend

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn.models import GCN

ROOT = Path(__file__).resolve().parents[2]
N, E, F_IN, HID, F_OUT = 30, 120, 8, 16, 4


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # the tests compile new GCNs of one class: empty Dynamo caches keep each clear of the
    # recompile limit of the shared code objects
    torch._dynamo.reset()
    yield


def _graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, F_IN, generator=g), torch.randint(0, N, (2, E), generator=g)


def _gcn(seed: int = 0, norm=None) -> torch.nn.Module:
    torch.manual_seed(seed)
    return GCN(F_IN, HID, 2, F_OUT, norm=norm)


class Parent(torch.nn.Module):
    """A model holding another one as its child ``body``, next to a plain layer."""

    def __init__(self, body: torch.nn.Module) -> None:
        super().__init__()
        self.head = torch.nn.Linear(F_OUT, 2)
        self.body = body

    def forward(self, x, edge_index):
        return self.head(self.body(x, edge_index))


def _randomized(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter and float buffer overwritten with distinct values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
    return module


def _names(module: torch.nn.Module):
    return {"state_dict": list(module.state_dict()),
            "parameters": [n for n, _ in module.named_parameters()],
            "buffers": [n for n, _ in module.named_buffers()],
            "modules": sorted({n for n, _ in module.named_modules()})}


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


# ------------------------------------------------------------------ point 13: compiled children
def test_child_names_equal_uncompiled():
    compiled = Parent(gnncompile.compile(_gcn(norm="batch_norm")))
    plain = Parent(_gcn(norm="batch_norm"))
    assert _names(compiled) == _names(plain)
    assert not any("_orig_mod" in k for k in compiled.state_dict())
    # the very same parameters, in the same order (what an optimizer's state is indexed by)
    expected = list(compiled.head.parameters()) + list(compiled.body.model.parameters())
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in expected]


@pytest.mark.parametrize("direction", ["compiled->plain", "plain->compiled"])
def test_child_checkpoint_both_ways(direction):
    x, ei = _graph()
    src_compiled = direction == "compiled->plain"
    src = Parent(gnncompile.compile(_gcn(1, "batch_norm")) if src_compiled else _gcn(1, "batch_norm"))
    dst = Parent(_gcn(2, "batch_norm") if src_compiled else gnncompile.compile(_gcn(2, "batch_norm")))
    _randomized(src, seed=3)
    result = dst.load_state_dict(src.state_dict())  # strict
    assert not result.missing_keys and not result.unexpected_keys
    _assert_same_state(dst, src)
    src.eval(), dst.eval()
    torch.testing.assert_close(dst(x, ei), src(x, ei))


class Outer(torch.nn.Module):
    """A model whose child is itself a compiled model."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.scale = torch.nn.Parameter(torch.ones(F_OUT))
        self.register_buffer("shift", torch.zeros(F_OUT))

    def forward(self, x, edge_index):
        return self.inner(x, edge_index) * self.scale + self.shift


def test_nested_compiled_children():
    x, ei = _graph()
    nested = Parent(gnncompile.compile(Outer(gnncompile.compile(_gcn(1)))))
    plain = Parent(Outer(_gcn(2)))
    assert _names(nested) == _names(plain)
    _randomized(nested, seed=4)
    plain.load_state_dict(nested.state_dict())
    _assert_same_state(plain, nested)
    _randomized(plain, seed=5)
    nested.load_state_dict(plain.state_dict())
    _assert_same_state(nested, plain)
    torch.testing.assert_close(nested(x, ei), plain(x, ei))


def test_child_load_errors_use_callers_names():
    model = Parent(gnncompile.compile(_gcn()))
    state = Parent(_gcn()).state_dict()
    del state["body.convs.0.bias"]
    state["body.convs.9.bias"] = torch.zeros(3)
    with pytest.raises(RuntimeError) as err:
        model.load_state_dict(state)
    assert '"body.convs.0.bias"' in str(err.value) and '"body.convs.9.bias"' in str(err.value)
    assert "_orig_mod" not in str(err.value)
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["body.convs.0.bias"]
    assert result.unexpected_keys == ["body.convs.9.bias"]
    bad = Parent(_gcn()).state_dict()
    bad["body.convs.1.bias"] = torch.zeros(F_OUT + 1)
    with pytest.raises(RuntimeError, match=r"size mismatch for body\.convs\.1\.bias") as err:
        model.load_state_dict(bad)
    assert "_orig_mod" not in str(err.value)
    assert model.body._loading == []  # every load's record was consumed


def test_optimizer_state_moves_between_compiled_and_plain():
    x, ei = _graph()
    target = torch.randn(N, 2, generator=torch.Generator().manual_seed(9))

    def step(model, opt):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x, ei), target).backward()
        opt.step()

    compiled = Parent(gnncompile.compile(_gcn(1)))
    opt_c = torch.optim.Adam(compiled.parameters(), lr=0.01)
    for _ in range(2):
        step(compiled, opt_c)
    buf = io.BytesIO()  # a checkpoint file (loading an in-memory optimizer state would share
    torch.save({"model": compiled.state_dict(), "opt": opt_c.state_dict()}, buf)  # its tensors)
    buf.seek(0)
    ckpt = torch.load(buf)
    plain = Parent(_gcn(2))
    opt_p = torch.optim.Adam(plain.parameters(), lr=0.01)
    plain.load_state_dict(ckpt["model"])
    opt_p.load_state_dict(ckpt["opt"])
    for (n, a), (m, b) in zip(compiled.named_parameters(), plain.named_parameters()):
        assert n == m and set(opt_c.state[a]) == set(opt_p.state[b]) == {"step", "exp_avg", "exp_avg_sq"}
        for k in opt_c.state[a]:
            torch.testing.assert_close(opt_p.state[b][k], opt_c.state[a][k], rtol=0, atol=0)
    step(compiled, opt_c)
    step(plain, opt_p)
    for (n, a), (m, b) in zip(compiled.named_parameters(), plain.named_parameters()):
        assert n == m
        torch.testing.assert_close(a, b, msg=n)


def test_wrapper_mirrors_training_mode():
    model = gnncompile.compile(_gcn().eval())
    assert model.training is False and model.model.training is False
    model.train()
    assert model.training and all(m.training for m in model.model.modules())


def test_deepcopy_is_a_compiled_copy():
    x, ei = _graph()
    model = gnncompile.compile(_gcn(), inner="eager")
    twin = copy.deepcopy(model)
    assert isinstance(twin, CompiledModule) and twin.model is not model.model
    assert twin.gnncompile_settings.inner == "eager"
    torch.testing.assert_close(twin(x, ei), model(x, ei))


# ------------------------------------------------------------------ point 15: pickling
def test_backend_is_picklable():
    be = pickle.loads(pickle.dumps(make_backend("eager", rewrite=False)))
    assert (be.inner, be.rewrite) == ("eager", False)
    fn = torch.compile(lambda a: torch.relu(a) + 1, backend=be)
    a = torch.randn(5)
    torch.testing.assert_close(fn(a), torch.relu(a) + 1)
    lin = torch.nn.Linear(3, 2)  # a plain torch.compile result holding one pickles as well
    buf = io.BytesIO()
    torch.save(torch.compile(lin, backend=make_backend("eager")), buf)
    buf.seek(0)
    x = torch.randn(4, 3)
    torch.testing.assert_close(torch.load(buf, weights_only=False)(x), lin(x))
    with pytest.raises(ValueError, match="unknown inner compiler"):
        make_backend("nope")


# A fresh interpreter, which has not imported gnncompile: (1) torch.compile by the backend's name
# (point 14), then (2) torch.load of a pickled gnncompile.compile(model) (point 15).
_FRESH = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from torch_geometric.nn.models import GCN
out = {}
x, ei, expected = torch.load(sys.argv[2])
try:
    assert "gnncompile" not in sys.modules
    torch.manual_seed(0)
    model = GCN(x.size(1), 16, 2, expected.size(1)).eval()
    eager = model(x, ei)
    got = torch.compile(model, backend="gnncompile")(x, ei)
    stats = sys.modules["gnncompile.compiler.backend"].STATS
    out["by_name"] = {"ok": True, "max_err": (got - eager).abs().max().item(),
                      "fused": stats["fused"]}
except Exception as e:
    out["by_name"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
try:
    torch._dynamo.reset()
    loaded = torch.load(sys.argv[1], weights_only=False)
    stats = sys.modules["gnncompile.compiler.backend"].STATS
    before = stats["fused"]
    got = loaded(x, ei)
    out["load"] = {"ok": True, "type": type(loaded).__name__, "training": loaded.training,
                   "inner": loaded.gnncompile_settings.inner,
                   "max_err": (got - expected).abs().max().item(), "fused": stats["fused"] - before}
except Exception as e:
    out["load"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory):
    """Pickles a compiled GCN here, then runs _FRESH in a new interpreter."""
    tmp = tmp_path_factory.mktemp("fresh")
    x, ei = _graph()
    model = gnncompile.compile(_randomized(_gcn(7), seed=8), inner="aot_eager").eval()
    expected = model(x, ei)  # compiled and run before saving
    torch.save((x, ei, expected.detach()), tmp / "inputs.pt")
    try:
        torch.save(model, tmp / "model.pt")
        save_error = None
    except Exception as e:  # reported by the load test; the by-name part runs regardless
        save_error = f"{type(e).__name__}: {e}"
    # one thread: the graph is tiny, and OpenMP threads spinning on a busy machine cost minutes
    env = dict(os.environ, GNNCOMPILE_INNER="aot_eager", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _FRESH, str(tmp / "model.pt"), str(tmp / "inputs.pt")],
                          capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return dict(json.loads(lines[-1][len("RESULT "):]), save_error=save_error)


def test_entry_point_declared():
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    target = eps["torch_dynamo_backends"]["gnncompile"]
    assert target == "gnncompile.compiler.backend:gnncompile_backend"
    from importlib.metadata import entry_points

    installed = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
    assert installed.get("gnncompile") == target, (
        "the installed gnncompile's metadata lacks the torch_dynamo_backends entry point: "
        "reinstall it (pip install --no-build-isolation -e .)")


def test_backend_by_name_without_importing_gnncompile(fresh_process):
    r = fresh_process["by_name"]
    assert r["ok"], r.get("error")
    assert r["max_err"] < 1e-5 and r["fused"] > 0, r


def test_torch_save_load_in_fresh_process(fresh_process):
    assert fresh_process["save_error"] is None, fresh_process["save_error"]
    r = fresh_process["load"]
    assert r["ok"], r.get("error")
    assert r["type"] == "CompiledModule" and r["inner"] == "aot_eager" and r["training"] is False, r
    assert r["max_err"] < 1e-5 and r["fused"] > 0, r


# ------------------------------------------------------------------ Lightning
def test_lightning_train_checkpoint_restore_resume(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    class Graphs(torch.utils.data.Dataset):
        def __init__(self):
            self.x, self.ei = _graph()
            self.y = torch.randint(0, F_OUT, (N,), generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.x, self.ei, self.y

    class Module(pl.LightningModule):
        def __init__(self, compiled: bool = True):
            super().__init__()
            self.save_hyperparameters()
            self.model = gnncompile.compile(_gcn(0)) if compiled else _gcn(0)
            self.start_steps = []

        def on_train_start(self):
            self.start_steps.append(self.trainer.global_step)

        def training_step(self, batch, _):
            x, ei, y = batch
            return torch.nn.functional.cross_entropy(self.model(x, ei), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

    def trainer(steps):
        return pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                          enable_progress_bar=False, enable_model_summary=False,
                          enable_checkpointing=False, default_root_dir=tmp_path)

    def loader():
        return torch.utils.data.DataLoader(Graphs(), batch_size=None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice (num_workers, ...)
        module = Module()
        initial = copy.deepcopy(module.state_dict())
        t1 = trainer(3)
        t1.fit(module, loader())
        assert t1.global_step == 3
        assert any(not torch.equal(initial[k], v) for k, v in module.state_dict().items())
        ckpt = tmp_path / "step3.ckpt"
        t1.save_checkpoint(ckpt)
        saved = torch.load(ckpt, weights_only=False)
        assert list(saved["state_dict"]) == list(Module(compiled=False).state_dict())

        restored = Module.load_from_checkpoint(ckpt)
        assert isinstance(restored.model, CompiledModule)
        _assert_same_state(restored, module)
        plain = Module.load_from_checkpoint(ckpt, compiled=False)  # into the uncompiled model
        _assert_same_state(plain, module)

        resumed = Module()
        t2 = trainer(5)
        t2.fit(resumed, loader(), ckpt_path=ckpt)
        assert resumed.start_steps == [3] and t2.global_step == 5
        adam = t2.optimizers[0].state_dict()["state"]
        assert all(int(s["step"]) == 5 for s in adam.values()), adam


# ------------------------------------------------ issue 32, point 6: torch.compile's checkpoints
def test_checkpoints_move_between_eager_gnncompile_and_torch_compile_forms():
    torch.manual_seed(0)
    forms = {"eager": lambda m: m, "gnncompile": gnncompile.compile,
             "torch.compile": lambda m: torch.compile(m, backend="gnncompile")}
    saved = {}
    for name, wrap in forms.items():
        model = _gcn(norm="batch_norm")
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_()  # every form's checkpoint differs from a fresh model's
        saved[name] = (wrap(model).state_dict(), gnncompile.state_dict(wrap(model)), model.state_dict())
    assert all(k.startswith("_orig_mod.") for k in saved["torch.compile"][0])  # torch's own key names
    for src, (raw, own, want) in saved.items():
        assert list(own) == list(want)  # gnncompile.state_dict: the model's own names in every form
        for dst, wrap in forms.items():
            target = wrap(_gcn(norm="batch_norm"))
            gnncompile.load_state_dict(target, raw)  # any checkpoint into any form
            got = gnncompile.unwrap(target).state_dict()
            for k in want:
                torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=f"{src} -> {dst}: {k}")
    # gnncompile.compile's own load_state_dict takes a torch.compile checkpoint as it is
    target = gnncompile.compile(_gcn(norm="batch_norm"))
    assert not target.load_state_dict(saved["torch.compile"][0]).missing_keys
    with pytest.raises(RuntimeError, match="Missing key"):  # a wrong checkpoint still fails loudly
        gnncompile.load_state_dict(_gcn(norm="batch_norm"), {"_orig_mod.nope": torch.zeros(1)})
