"""gnncompile.hardware.device / .profiles / compile(profile=...): detection, the default rule,
profile round-trip, atomic writes, nearest-workload choice, and bad profiles (corrupt, foreign,
stale) that must warn and fall back, never crash."""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

import gnncompile
from gnncompile import profiles
from gnncompile.hardware import device


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    yield


def _doc(settings=None, workload=None, props=None, **kw):
    props = props or device.detect("cpu")
    s = {"knobs": [3], "threads": 1, "batch_size": 64, "pool_size": 3, "num_workers": 0,
         "pin_memory": False, "persistent_workers": False}
    s.update(settings or {})
    return profiles.make(props, workload or {"kind": "graphs", "model": "gin", "num_graphs": 1000},
                         s, tuned=200.0, default=100.0, unit="graphs/s", **kw)


# ------------------------------------------------------------------------------- detection
def test_detect_cpu():
    p = device.detect("cpu")
    assert p["type"] == "cpu"
    assert isinstance(p["model"], str) and p["model"]
    assert p["logical_cpus"] >= 1 and 1 <= p["physical_cores"] <= p["logical_cpus"]
    assert p["threads"] == torch.get_num_threads()
    assert isinstance(p["isa"], list) and p["vector_bits"] in (64, 128, 256, 512)
    json.dumps(p)  # JSON-ready


def test_device_key_stable_and_safe():
    p = device.detect("cpu")
    k = device.device_key(p)
    assert k == device.device_key(device.detect("cpu"))
    assert k.startswith("cpu-") and all(c.isalnum() or c in "-" for c in k)
    # threads in use are a setting, not part of the key
    assert device.device_key({**p, "threads": 999}) == k
    assert device.device_key({**p, "logical_cpus": p["logical_cpus"] + 1}) != k


def test_cpu_key_names_the_caches():
    """Two CPUs a virtual machine names alike (model, cores, ISA) but with other caches (e.g. two
    EPYC generations) get other keys; caches the properties do not know are left out."""
    base = {"type": "cpu", "model": "AMD EPYC", "logical_cpus": 2, "isa": ["avx2", "fma"]}
    zen2 = device.device_key({**base, "l2_bytes": 512 << 10, "l3_bytes": 16 << 20})
    zen3 = device.device_key({**base, "l2_bytes": 512 << 10, "l3_bytes": 32 << 20})
    assert zen2 == "cpu-amd-epyc-2c-avx2-l2-512k-l3-16m"
    assert zen3 == "cpu-amd-epyc-2c-avx2-l2-512k-l3-32m"
    assert device.device_key({**base, "l2_bytes": 0, "l3_bytes": 0}) == "cpu-amd-epyc-2c-avx2"
    assert device.device_key({**base, "l2_bytes": 3 << 19}) == "cpu-amd-epyc-2c-avx2-l2-1p5m"


def test_cuda_key_from_properties():
    props = {"type": "cuda", "name": "NVIDIA A100-SXM4-40GB", "capability": [8, 0], "sm_count": 108,
             "memory_bytes": 40 << 30, "l2_bytes": 40 << 20, "host_logical_cpus": 16}
    assert device.device_key(props) == "cuda-a100-sxm4-40gb-sm80-108sm-40g"
    d = device.default_settings(props)
    assert d["knobs"] == [0, 0, 0, 0] and d["pin_memory"] and d["num_workers"] == 8


@pytest.mark.parametrize("cores,chunks,workers", [(1, 8, 0), (2, 8, 0), (8, 4, 2), (16, 2, 4), (64, 2, 4)])
def test_default_rule_cpu(cores, chunks, workers):
    d = device.default_settings({"type": "cpu", "physical_cores": cores, "logical_cpus": cores})
    assert d["knobs"] == [chunks] and d["threads"] == cores
    assert d["num_workers"] == workers and d["pool_size"] == workers + 2


# ------------------------------------------------------------------------------- files
def test_cache_dir_respects_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("GNNCOMPILE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert profiles.profile_dir() == tmp_path / "xdg" / "gnncompile" / "profiles"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert profiles.cache_dir() == __import__("pathlib").Path.home() / ".cache" / "gnncompile"


def test_round_trip(tmp_path):
    doc = _doc()
    path = profiles.save(doc)
    assert path.parent == profiles.profile_dir() and path.name == profiles.default_filename(doc)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    prof = profiles.load_file(path)
    assert prof.source == "file" and prof.settings["knobs"] == [3] and prof.settings["batch_size"] == 64
    assert prof.throughput["speedup"] == pytest.approx(2.0)
    assert prof.loader_kwargs() == {"batch_size": 64, "pool_size": 3, "num_workers": 0,
                                    "pin_memory": False, "persistent_workers": False}
    raw = json.loads(path.read_text())
    for k in ("gnncompile_version", "torch_version", "device", "workload", "settings", "throughput"):
        assert k in raw


def test_profile_file_mode_follows_umask(tmp_path):
    old = os.umask(0o022)
    try:
        path = profiles.save(_doc(), tmp_path)
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777) == 0o644


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    path = profiles.save(_doc(), tmp_path)
    before = path.read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(profiles.os, "replace", boom)
    with pytest.raises(OSError):
        profiles.save(_doc(settings={"knobs": [5]}), tmp_path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left


def test_nearest_workload(tmp_path):
    near = {"kind": "graphs", "model": "gin", "num_graphs": 1000}
    far = {"kind": "fullgraph", "model": "gcn", "num_nodes": 100000}
    profiles.save(_doc(settings={"knobs": [1]}, workload=near))
    profiles.save(_doc(settings={"knobs": [2]}, workload=far))
    assert profiles.find({"kind": "graphs", "model": "gin", "num_graphs": 2000}).knobs == [1]
    assert profiles.find({"kind": "fullgraph", "model": "gcn", "num_nodes": 5000}).knobs == [2]
    assert profiles.find(far).knobs == [2]  # exact signature
    assert profiles.find({"model": "gin"}).knobs == [1]


def test_auto_without_profile_gives_defaults():
    prof = profiles.resolve("auto")
    assert prof.is_default and prof.settings == {**device.default_settings(), **prof.settings}


# ------------------------------------------------------------------------------- bad files
def _load_warns(path):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prof = profiles.resolve(str(path))
    assert any(issubclass(x.category, profiles.ProfileWarning) for x in w), [str(x.message) for x in w]
    assert prof.is_default
    return prof, " ".join(str(x.message) for x in w)


# nested deeper than json's decoder recurses (it raised RecursionError, not a warning)
DEEP = ["[" * 100_000 + "]" * 100_000, '{"a": ' * 100_000 + "1" + "}" * 100_000]


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"format": "other"}', "\x00\xff",
                                     json.dumps({"format": "gnncompile-profile", "schema_version": 1}), *DEEP],
                         ids=lambda c: c[:12] if len(c) < 100 else f"nested-{c[0]}")
def test_corrupt_profile_warns(tmp_path, content):
    p = tmp_path / "bad.json"
    p.write_bytes(content.encode("latin1"))
    _, msg = _load_warns(p)
    assert "corrupt: " in msg or "stale: " in msg  # (the path holds the test's name)


@pytest.mark.parametrize("bad", [{"knobs": "fast"}, {"knobs": [-1]}, {"threads": 0},
                                 {"batch_size": 1.5}, {"pin_memory": "yes"}, {"num_workers": -2},
                                 {"inner": "turbo"}, {"inner": 3}])
def test_ill_typed_settings_warn(tmp_path, bad):
    p = tmp_path / "bad.json"
    doc = _doc()
    doc["settings"].update(bad)
    p.write_text(json.dumps(doc))
    _, msg = _load_warns(p)
    assert "corrupt" in msg


def test_truncated_profile_warns(tmp_path):
    path = profiles.save(_doc(), tmp_path)
    path.write_text(path.read_text()[:50])
    _load_warns(path)


def test_foreign_profile_warns(tmp_path):
    other = {**device.detect("cpu"), "model": "Some Other CPU", "logical_cpus": 1234}
    path = profiles.save(_doc(props=other), tmp_path)
    _, msg = _load_warns(path)
    assert "foreign" in msg


@pytest.mark.parametrize("field,value", [("gnncompile_version", "0.0.1"), ("torch_version", "1.13.1"),
                                         ("schema_version", 99)])
def test_stale_profile_warns(tmp_path, field, value):
    doc = _doc()
    doc[field] = value
    p = tmp_path / "stale.json"
    p.write_text(json.dumps(doc))
    _, msg = _load_warns(p)
    assert "stale" in msg


def test_auto_skips_bad_files_and_uses_good_one():
    d = profiles.profile_dir()
    d.mkdir(parents=True)
    key = device.device_key(device.detect("cpu"))
    (d / f"{key}__broken.json").write_text("{")
    (d / f"{key}__deep.json").write_text(DEEP[0])
    profiles.save(_doc(settings={"knobs": [7]}))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prof = profiles.resolve("auto", workload={"kind": "graphs", "model": "gin"})
    assert prof.knobs == [7]
    assert any("broken" in str(x.message) for x in w)
    assert any("deep.json: corrupt" in str(x.message) and "nested" in str(x.message) for x in w)


def test_deeply_nested_profile_never_crashes_find_or_compile():
    d = profiles.profile_dir()
    d.mkdir(parents=True)
    key = device.device_key(device.detect("cpu"))
    for i, text in enumerate(DEEP):
        (d / f"{key}__deep{i}.json").write_text(text)
    with pytest.raises(profiles.ProfileError, match="corrupt: .*nested deeper than"):
        profiles.read(d / f"{key}__deep0.json")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert profiles.find() is None
        c = gnncompile.compile(_Lin(), profile="auto")
    assert c.gnncompile_profile.is_default
    assert sum("nested deeper than" in str(x.message) for x in w) == 4, [str(x.message) for x in w]


# ------------------------------------------------------------------------------- compile
class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


def test_compile_applies_profile_from_path(tmp_path):
    path = profiles.save(_doc(settings={"knobs": [5]}), tmp_path)
    m = gnncompile.compile(_Lin(), profile=str(path))
    assert m.gnncompile_profile.path == str(path)
    assert m.gnncompile_settings.knobs_for(torch.device("cpu")) == [5]
    assert m.gnncompile_settings.profile == str(path)


def test_compile_uses_the_profiles_inner_compiler(tmp_path):
    path = profiles.save(_doc(settings={"inner": "aot_eager"}), tmp_path)
    assert profiles.load_file(path).inner == "aot_eager"
    m = gnncompile.compile(_Lin(), profile=str(path))
    assert m.gnncompile_settings.inner == "aot_eager" and "inner=aot_eager" in repr(m)
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    assert torch.allclose(m(x), m.model(x))
    # an explicit inner wins over the profile's; a profile without one leaves the default
    assert gnncompile.compile(_Lin(), profile=str(path), inner="eager").gnncompile_settings.inner == "eager"
    p2 = profiles.save(_doc(settings={"inner": None}), tmp_path / "other")
    with gnncompile.config.override(inner=None):  # the suite sets GNNCOMPILE_INNER
        assert gnncompile.compile(_Lin(), profile=str(p2)).gnncompile_settings.inner == "auto"


def test_compile_auto_and_none():
    profiles.save(_doc(settings={"knobs": [6]}, workload={"kind": "graphs", "model": "_lin"}))
    m = gnncompile.compile(_Lin())  # profile="auto"
    assert m.gnncompile_profile.source == "file" and m.gnncompile_settings.knobs_for("cpu") == [6]
    m = gnncompile.compile(_Lin(), profile=None)
    assert m.gnncompile_profile.is_default
    assert m.gnncompile_settings.knobs_for("cpu") == device.default_settings()["knobs"]
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    assert torch.allclose(m(x), m.model(x))


def test_compile_bad_profile_falls_back(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("garbage")
    with pytest.warns(profiles.ProfileWarning):
        m = gnncompile.compile(_Lin(), profile=str(p))
    assert m.gnncompile_profile.is_default
    with pytest.warns(profiles.ProfileWarning):
        gnncompile.compile(_Lin(), profile=str(tmp_path / "missing.json"))
