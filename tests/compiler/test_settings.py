"""Settings travel with the compiled model (gnncompile.settings), one configuration module owns
the environment (gnncompile.config), and the package's subpackages import one another without
a cycle."""
from __future__ import annotations

import ast
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from torch_geometric.nn import GATConv, SAGEConv

import gnncompile
from gnncompile import config, profiles
from gnncompile.hardware import device
from gnncompile.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gnncompile"
KNOBBED = ("spmm", "edge_softmax", "edge_softmax_backward", "edge_dot", "gather", "message_reduce",
           "message_edges", "attention", "attention_backward")


class KernelCalls:
    """Records the knobs argument of every gnncompile kernel call (forward and backward), as
    the dispatcher hands it to the kernel: torch's profiler keeps each op's concrete arguments.
    (A TorchDispatchMode would not do: Dynamo runs a compiled model's original code under one.)"""

    def __enter__(self):
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                            record_shapes=True)
        self._prof.__enter__()
        self.calls = []
        return self

    def __exit__(self, *exc):
        self._prof.__exit__(*exc)
        for e in self._prof.events():
            ns, _, name = e.name.partition("::")
            if ns != "gnncompile" or name not in KNOBBED:
                continue
            schema = getattr(torch.ops.gnncompile, name).default._schema
            (i,) = [i for i, a in enumerate(schema.arguments) if a.name == "knobs"]
            self.calls.append((name, list(e.concrete_inputs[i])))
        return False


def _graph(n=60, e=400, f=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randint(0, n, (2, e), generator=g)


def _profile(knobs):
    props = device.detect("cpu")
    doc = profiles.make(props, {"kind": "fullgraph", "model": "test"},
                        {**device.default_settings(props), "knobs": knobs})
    return doc


class _Net(torch.nn.Module):
    """A SAGE layer (spmm) and a GAT layer (edge softmax, message programs): every knobbed
    kernel kind in one model."""

    def __init__(self):
        super().__init__()
        self.sage = SAGEConv(8, 8, aggr="mean")
        self.gat = GATConv(8, 4, heads=2)

    def forward(self, x, ei):
        return self.gat(self.sage(x, ei).relu(), ei)


def _step(model, x, ei):
    x = x.clone().requires_grad_()
    with KernelCalls() as rec:
        model(x, ei).square().sum().backward()
    return rec.calls


def test_two_models_with_different_profiles_each_run_with_their_own_knobs():
    """Compiled in one process with profiles whose knobs differ, called interleaved: every
    kernel call of each model, forward and backward, gets that model's knobs."""
    torch.manual_seed(0)
    a_model, b_model = _Net(), _Net()
    a = gnncompile.compile(a_model, profile=_profile([3]), inner="aot_eager")
    b = gnncompile.compile(b_model, profile=_profile([5]), inner="aot_eager")
    assert a.gnncompile_settings.knobs_for("cpu") == [3] and b.gnncompile_settings.knobs_for("cpu") == [5]
    x, ei = _graph()
    for step in range(2):  # a, b, a, b: compiled in turn, then run from Dynamo's cache
        for model, want in ((a, [3]), (b, [5])):
            calls = _step(model, x, ei)
            names = {n for n, _ in calls}
            assert "attention" in names, calls  # the forward kernel ran (GATConv's fused attention)
            assert "attention_backward" in names, calls  # and the backward one
            assert all(k == want for _, k in calls), (step, want, calls)
    # and they compute what the models compute
    torch.testing.assert_close(a(x, ei), a_model(x, ei))
    torch.testing.assert_close(b(x, ei), b_model(x, ei))


def test_export_uses_the_compiled_models_own_knobs(tmp_path):
    torch.manual_seed(0)
    net = SAGEConv(8, 8, aggr="mean").eval()
    a = gnncompile.compile(net, profile=_profile([3]))
    b = gnncompile.compile(net, profile=_profile([5]))
    x, ei = _graph()
    res_a = gnncompile.export(a, (x, ei), tmp_path / "a.pt2", format="pt2")
    res_b = gnncompile.export(b, (x, ei), tmp_path / "b.pt2", format="pt2")
    for res, want in ((res_a, [3]), (res_b, [5]), (res_a, [3])):
        mod = res.program.module()
        with KernelCalls() as rec:
            out = mod(x, ei)
        assert rec.calls and all(k == want for _, k in rec.calls), rec.calls
        torch.testing.assert_close(out, net(x, ei))
    # a model that was not compiled exports with the configuration's settings: the kernels' own
    plain = gnncompile.export(net, (x, ei), tmp_path / "c.pt2", format="pt2").program.module()
    with KernelCalls() as rec:
        plain(x, ei)
    assert rec.calls and all(k == [] for _, k in rec.calls), rec.calls


def test_settings_are_shown_explained_and_survive_pickling():
    x, ei = _graph()
    m = gnncompile.compile(SAGEConv(8, 8), settings={"knobs": {"cpu": [7]}, "inner": "eager"})
    s = m.gnncompile_settings
    assert s.knobs_for(torch.device("cpu")) == [7] and s.inner == "eager"
    rep = gnncompile.explain(m, x, ei)
    assert rep.settings == s and "knobs: cpu [7]" in str(rep) and "inner: eager" in str(rep)
    assert rep.as_dict()["settings"]["knobs"] == {"cpu": [7]}
    twin = pickle.loads(pickle.dumps(m))
    assert twin.gnncompile_settings == s
    with KernelCalls() as rec:
        twin(x, ei)
    assert rec.calls and all(k == [7] for _, k in rec.calls)


def test_settings_precedence_and_checks():
    prof = profiles.resolve(_profile([4]))
    with config.override(inner="aot_eager", slot_order=False):
        s = Settings.build(prof)
        assert (s.inner, s.slot_order, s.knobs_for("cpu"), s.knobs_for("cuda")) == ("aot_eager", False, [4], [])
        assert Settings.build(prof, inner="eager").inner == "eager"  # explicit wins
        assert Settings.build(prof, inner="auto").inner == "aot_eager"  # 'auto' leaves it
    s = Settings().replace(knobs={"cpu": [2]}, op_knobs={("spmm", "cpu"): [9]})
    assert s.knobs_for("cpu", "spmm") == [9] and s.knobs_for("cpu", "gather") == [2]
    assert hash(s) == hash(Settings().replace(knobs={"cpu": [2]}, op_knobs={("spmm", "cpu"): [9]}))
    with pytest.raises(AttributeError):
        s.inner = "eager"  # immutable
    for bad, err in (({"inner": "fast"}, "inner must be"), ({"knobs": {"cpu": [-1]}}, "ints >= 0"),
                     ({"knobs": {"tpu": [1]}}, "device type"), ({"op_knobs": {("conv", "cpu"): [1]}}, "op must"),
                     ({"structure_check": "sometimes"}, "structure_check"), ({"threads": 0}, "threads"),
                     ({"loader": {"workers": 2}}, "loader keys")):
        with pytest.raises((ValueError, TypeError), match=err):
            Settings().replace(**bad)
    with pytest.raises(ValueError, match="unknown inner compiler 'fast'"):
        gnncompile.compile(SAGEConv(8, 8), inner="fast")


# ----------------------------------------------------------------------------- configuration
def test_every_environment_read_is_in_the_configuration_module():
    """``os.environ`` / ``os.getenv`` appear only in gnncompile/config.py (package and tuner),
    and nothing defines or calls set_knobs any more."""
    offenders = []
    for f in list(PACKAGE.rglob("*.py")) + list((ROOT / "tuner").rglob("*.py")):
        text = f.read_text()
        if f == PACKAGE / "config.py":
            continue
        for m in re.finditer(r"\bos\.(environ|getenv)\b|\bgetenv\(|\bset_knobs\b", text):
            offenders.append(f"{f.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {m.group()}")
    assert offenders == []
    assert "GNNCOMPILE_" in (PACKAGE / "config.py").read_text()


@pytest.mark.parametrize("var,value", [("GNNCOMPILE_INNER", "fast"), ("GNNCOMPILE_CAPTURE_DYNAMIC", "maybe"),
                                       ("GNNCOMPILE_SLOT_ORDER", "2"), ("GNNCOMPILE_STRUCTURE_CHECK", "sometimes"),
                                       ("GNNCOMPILE_DISABLE_NATIVE", "perhaps")])
def test_a_bad_value_is_an_error_naming_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(config.ConfigError, match=f"{var}='{value}'"):
        config.current()
    with pytest.raises(config.ConfigError, match=var):
        gnncompile.compile(SAGEConv(8, 8))


def test_values_parse_and_override(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNCOMPILE_CAPTURE_DYNAMIC", "off")
    monkeypatch.setenv("GNNCOMPILE_STRUCTURE_CHECK", "2")
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GNNCOMPILE_INNER", "")  # empty is unset
    c = config.current()
    assert (c.capture_dynamic, c.structure_check, c.cache_dir, c.inner) == (False, "all", tmp_path, None)
    assert config.cache_dir() == tmp_path and profiles.profile_dir() == tmp_path / "profiles"
    with config.override(structure_check="off", inner="eager") as o:
        assert (o.structure_check, o.inner, o.capture_dynamic) == ("off", "eager", False)
        assert Settings.from_config().inner == "eager"
    assert config.current().structure_check == "all" and config.current().inner is None
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_SLOT_ORDER"):
        with config.override(slot_order="sideways"):
            pass
    with pytest.raises(TypeError, match="unknown field"):
        with config.override(speed="max"):
            pass


def test_an_unchanged_environment_is_read_without_decoding_it(monkeypatch):
    """config.current() at every call of the message ops' backward: an environment that has not
    changed is compared without ``os.environ.get`` (which encodes each of the twenty names and
    decodes each value, 17 us a call on this project's CPU); a change is still seen at once."""
    monkeypatch.setenv("GNNCOMPILE_STRUCTURE_CHECK", "2")
    assert config.current().structure_check == "all"
    calls = []
    real_get = os.environ.get

    def get(name, default=None):
        calls.append(name)
        return real_get(name, default)

    monkeypatch.setattr(os.environ, "get", get, raising=False)
    for _ in range(3):
        assert config.current().structure_check == "all"
    assert calls == []
    monkeypatch.setenv("GNNCOMPILE_STRUCTURE_CHECK", "off")  # through os.environ, as any user's change
    assert config.current().structure_check == "off"
    monkeypatch.delenv("GNNCOMPILE_STRUCTURE_CHECK")
    assert config.current().structure_check == "cpu"


def test_cuda_unverified_variable_and_choice(monkeypatch):
    """GNNCOMPILE_CUDA_UNVERIFIED names the ops whose unverified CUDA kernels the passes may use
    (config.CUDA_UNVERIFIED_OPS); it becomes choices['cuda_unverified'], canonical and checked."""
    assert config.current().cuda_unverified == "" and Settings.from_config().cuda_unverified == ()
    every = config.CUDA_UNVERIFIED_OPS
    assert every == ("attention_v2", "attention_dot", "attention")
    for raw, want in (("attention_dot", ("attention_dot",)),
                      (" Attention_dot , attention_v2 ", ("attention_v2", "attention_dot")),
                      ("attention", ("attention",)), ("all", every), ("none", ())):
        monkeypatch.setenv("GNNCOMPILE_CUDA_UNVERIFIED", raw)
        assert Settings.from_config().cuda_unverified == want, raw
    monkeypatch.setenv("GNNCOMPILE_CUDA_UNVERIFIED", "spmm")  # spmm's CUDA kernel is on: not an option
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_CUDA_UNVERIFIED='spmm'"):
        config.current()
    monkeypatch.delenv("GNNCOMPILE_CUDA_UNVERIFIED")
    with config.override(cuda_unverified="attention_v2"):
        assert Settings.build().cuda_unverified == ("attention_v2",)
    s = Settings().replace(choices={"cuda_unverified": "attention_dot,attention_v2"})
    assert s.cuda_unverified == ("attention_v2", "attention_dot")
    assert dict(s.choices)["cuda_unverified"] == "attention_v2,attention_dot"
    assert Settings().replace(choices={"cuda_unverified": ""}).choices == ()
    for bad in ("spmm", ["attention_v2"]):
        with pytest.raises(ValueError, match="cuda_unverified"):
            Settings().replace(choices={"cuda_unverified": bad})


def test_the_readme_table_is_the_configuration():
    readme = (ROOT / "README.md").read_text()
    assert config.table() in readme
    for var in config.VARIABLES:
        assert var.name in readme


# ----------------------------------------------------------------------------- import graph
def _unit(parts):
    return parts[0] if parts else ""


def import_graph():
    """{subpackage or top-level module of gnncompile: the others it imports}, from every import
    statement (also those inside functions)."""
    edges = {}
    for f in PACKAGE.rglob("*.py"):
        rel = f.relative_to(PACKAGE).with_suffix("").parts
        mod = rel[:-1] if rel[-1] == "__init__" else rel
        pkg = list(mod) if rel[-1] == "__init__" else list(mod[:-1])
        src = _unit(mod)
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg[:len(pkg) - (node.level - 1)]
                full = base + (node.module.split(".") if node.module else [])
                names = [full + [a.name] for a in node.names] if node.module is None else [full]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gnncompile":
                full = node.module.split(".")[1:]
                names = [full] if full else [[a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "gnncompile"]
            for n in names:
                dst = _unit(n)
                if src and dst and dst != src and dst not in ("__version__", "_C"):
                    edges.setdefault(src, set()).add(dst)
    return edges


def _cycle(edges):
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if not state.get(v):
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(edges):
        if not state.get(u):
            found = visit(u)
            if found:
                return found
    return None


def test_no_import_cycle_between_subpackages():
    edges = import_graph()
    assert _cycle(edges) is None, _cycle(edges)
    # the layers the map describes
    assert edges.get("config", set()) == set()  # imports nothing of the package
    assert edges.get("settings", set()) <= {"config", "ops"}  # ops: the process-wide structure check
    assert "compiler" not in edges.get("profiles", set()) and "profiles" not in edges.get("hardware", set())
    assert edges.get("ops", set()) <= {"config", "_log"}
    # the walk sees real edges (a walk that found none would pass the cycle check vacuously)
    assert {"ops", "passes", "settings"} <= edges["compiler"]


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_ops_names_the_op_namespace():
    offenders = [str(f.relative_to(ROOT)) for f in PACKAGE.rglob("*.py")
                 if "ops" not in f.relative_to(PACKAGE).parts[:1]
                 and re.search(r"torch\.ops\.gnncompile", f.read_text())]
    assert offenders == []


def test_each_model_keeps_its_structure_check_mode():
    """Two models sharing one edge_index, compiled with the check off and on: an edit that
    bypasses the version counter is missed by the first (as documented for 'off') and seen by
    the second, whatever the process-wide mode is when they run."""
    from gnncompile.ops import structure

    torch.manual_seed(0)
    net = SAGEConv(8, 8)
    x, ei = _graph()
    off = gnncompile.compile(net, settings={"structure_check": "off"}, inner="aot_eager")
    cpu = gnncompile.compile(net, settings={"structure_check": "cpu"}, inner="aot_eager")
    saved = structure.structure_check()
    try:
        structure.set_structure_check("all")  # the process-wide mode does not reach them
        old = net(x, ei).detach()
        off(x, ei), cpu(x, ei)  # structures (and hoisted results) cached
        ei.data[1, :200] = 0  # behind the version counter
        want = net(x, ei).detach()
        assert not torch.allclose(old, want)
        torch.testing.assert_close(off(x, ei), old)  # 'off': the cached structure, stale
        torch.testing.assert_close(cpu(x, ei), want)  # 'cpu': the fingerprint sees the edit
        structure.set_structure_check("off")
        assert gnncompile.compile(net).gnncompile_settings.structure_check == "off"  # recorded at compile
    finally:
        structure.set_structure_check(saved)
