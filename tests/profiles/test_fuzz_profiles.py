"""Fuzz over device profiles (issue 14): random JSON values in every field (ints huge, negative
or zero, floats, NaN-like strings, lists, nested objects, nulls, wrong types), thousands of
documents with a fixed seed. Loading never raises; each document either loads (values above
their range clamped, with a ProfileWarning) or falls back to the defaults with a ProfileWarning;
and the Profile's settings are always within the documented ranges."""
from __future__ import annotations

import json
import random
import warnings

import pytest
import torch

from gnncompile.compiler.backend import INNERS
from gnncompile import profiles
from gnncompile.hardware import device
from gnncompile.settings import Settings

SEED = 20260014
CASES = 3000
CPU = {**device.detect("cpu"), "logical_cpus": 4, "physical_cores": 2}
CUDA = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "sm_count": 132,
        "memory_bytes": 80 << 30, "l2_bytes": 50 << 20, "host_logical_cpus": 3}

# The documented ranges (module docstring of gnncompile.profiles), written out here
# as the specification rather than taken from the code under test.
def _ranges(props):
    cpus = props.get("logical_cpus") or props["host_logical_cpus"]
    return {"threads": (1, cpus), "num_workers": (0, 2 * cpus), "pool_size": (1, max(8, 2 * cpus + 2)),
            "batch_size": (1, 2**20)}


KNOB_MAX = {"cpu": [4096, 64, 2**22], "cuda": [32, 256, 16, 2**20]}

INTS = [0, 1, -1, 2, 3, 4, 7, 8, 9, 16, 17, 32, 33, 64, 256, 257, 4096, 4097, 2**20, 2**20 + 1, 2**31,
        2**62, 2**63 - 1, 2**63, 2**64, 2**70, 10**30, -(2**63), -(2**70)]
FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, -1.5, 1e300, float("nan"), float("inf"), -float("inf")]
STRINGS = ["", "NaN", "nan", "inf", "-inf", "1", "8", "null", "true", "auto", "aot_eager", "inductor",
           "eager", "\x00", "é" * 3]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 2 else 7)
    if kind == 0:
        return rng.choice(INTS)
    if kind == 1:
        return rng.randint(-5, 10**6)
    if kind == 2:
        return rng.choice(FLOATS)
    if kind == 3:
        return rng.choice(STRINGS)
    if kind == 4:
        return rng.choice([True, False])
    if kind in (5, 6):
        return None if kind == 5 else rng.choice(list(INNERS))
    if kind == 7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {rng.choice(["knobs", "type", "a", "0", ""]): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def random_setting(rng: random.Random, key: str):
    """Mostly values of the setting's own type (in range, huge, zero, negative), else anything."""
    if rng.random() < 0.3:
        return random_json(rng)
    if key == "knobs":
        ints = [v for v in INTS if v >= 0]
        pool = ints if rng.random() < 0.8 else INTS + FLOATS + STRINGS + [None, True]
        return [rng.choice(pool) for _ in range(rng.randint(0, 6))]
    if key in ("pin_memory", "persistent_workers"):
        return rng.choice([True, False, None])
    if key == "inner":
        return rng.choice([*INNERS, None])
    if key == "spmm_impl":
        return rng.choice([*profiles.SPMM_IMPLS, None, "mkl", ""])
    if key == "precision":
        return rng.choice([*profiles.PRECISIONS, None, "fp16", ""])
    return rng.choice([v for v in INTS if v >= 0] + [1, 2, 3, 4, 5, 6, 8, 64, 128, None])


def expected_settings(settings, device_type, props):
    """What loading ``settings`` must give: (settings, clamped?) or None when the profile must be
    refused."""
    out, clamped = dict(settings), False
    for key, (lo, hi) in _ranges(props).items():
        v = settings.get(key)
        if v is None:
            continue
        if not _is_int(v) or v < lo:
            return None
        out[key], clamped = min(v, hi), clamped or v > hi
    knobs = settings.get("knobs")
    if knobs is not None:
        if not isinstance(knobs, list) or not all(_is_int(k) and k >= 0 for k in knobs):
            return None
        tops = KNOB_MAX[device_type]
        clamped = clamped or len(knobs) > len(tops) or any(k > t for k, t in zip(knobs, tops))
        out["knobs"] = [min(k, t) for k, t in zip(knobs, tops)]
    for key in ("pin_memory", "persistent_workers"):
        if settings.get(key) is not None and not isinstance(settings[key], bool):
            return None
    if settings.get("inner") is not None and settings["inner"] not in INNERS:
        return None
    if settings.get("spmm_impl") is not None and settings["spmm_impl"] not in profiles.SPMM_IMPLS:
        return None
    if settings.get("precision") is not None and settings["precision"] not in profiles.PRECISIONS:
        return None
    return out, clamped


def assert_within_ranges(prof, props):
    s = prof.settings
    assert set(profiles.SETTING_KEYS) <= set(s)
    for key, (lo, hi) in _ranges(props).items():
        assert s[key] is None or (_is_int(s[key]) and lo <= s[key] <= hi), (key, s[key])
    knobs, tops = prof.knobs, KNOB_MAX[props["type"]]
    assert len(knobs) <= len(tops) and all(_is_int(k) and 0 <= k <= t for k, t in zip(knobs, tops)), knobs
    for key in ("pin_memory", "persistent_workers"):
        assert s[key] is None or isinstance(s[key], bool)
    assert s["inner"] is None or s["inner"] in INNERS
    assert s["spmm_impl"] is None or s["spmm_impl"] in profiles.SPMM_IMPLS
    assert s["precision"] is None or s["precision"] in profiles.PRECISIONS


TOP_FIELDS = ["format", "schema_version", "gnncompile_version", "torch_version", "device", "device_key",
              "workload", "workload_signature", "throughput", "study", "created", "settings"]


def random_doc(rng: random.Random, props):
    """A valid profile with 1-3 settings replaced by random values and, one time in five, a
    top-level field replaced or removed. Returns (doc, only_settings_changed)."""
    base = {"knobs": [4] if props["type"] == "cpu" else [0, 0, 0, 0], "threads": 1, "batch_size": 64,
            "pool_size": 3, "num_workers": 0, "pin_memory": False, "persistent_workers": False, "inner": None,
            "spmm_impl": None, "precision": None}
    doc = profiles.make(props, {"kind": "graphs", "model": "gin", "num_graphs": 100}, base,
                        tuned=2.0, default=1.0, unit="graphs/s")
    for key in rng.sample(list(profiles.SETTING_KEYS), rng.randint(1, 3)):
        doc["settings"][key] = random_setting(rng, key)
    if rng.random() < 0.2:
        field = rng.choice(TOP_FIELDS)
        if rng.random() < 0.2:
            doc.pop(field)
        else:
            doc[field] = random_json(rng)
        return doc, False
    return doc, True


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)


def _load(rng, doc, props, tmp_path, i):
    """The Profile of ``doc`` by one of the public ways in, and the ProfileWarnings it gave."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        way = rng.randrange(3)
        if way == 0:  # a dict handed to resolve (compile(profile=dict))
            prof = profiles.resolve(doc, device=props["type"])
        else:  # a file: by path, or found in a folder by 'auto' / a directory
            path = tmp_path / f"{device.device_key(props)}__case{i}.json"
            path.write_text(json.dumps(doc))
            prof = profiles.load_file(path, props) if way == 1 else profiles.resolve(str(tmp_path))
            path.unlink()
    return prof, [str(x.message) for x in w if issubclass(x.category, profiles.ProfileWarning)]


def test_fuzz_profiles_load_clamped_or_default(isolated, monkeypatch):
    rng = random.Random(SEED)
    current = {}
    monkeypatch.setattr(device, "detect", lambda *a, **k: dict(current["props"]))
    outcomes = {"loaded": 0, "clamped": 0, "default": 0}
    for i in range(CASES):
        props = CPU if rng.random() < 0.7 else CUDA
        current["props"] = props
        doc, only_settings = random_doc(rng, props)
        prof, msgs = _load(rng, doc, props, isolated, i)
        where = f"case {i}: {doc.get('settings')!r}"
        assert_within_ranges(prof, props)
        assert isinstance(prof.summary(), str) and isinstance(prof.loader_kwargs(), dict)
        if prof.is_default:
            assert msgs, f"{where}: fell back to the defaults without a ProfileWarning"
            outcomes["default"] += 1
        else:
            outcomes["clamped" if msgs else "loaded"] += 1
        if only_settings:
            want = expected_settings(doc["settings"], props["type"], props)
            if want is None:
                assert prof.is_default and any("corrupt" in m for m in msgs), f"{where}: {msgs}"
            else:
                settings, clamped = want
                assert not prof.is_default, f"{where}: {msgs}"
                assert {k: prof.settings[k] for k in settings} == settings, where
                assert bool(msgs) == clamped, f"{where}: {msgs}"
        if props["type"] == "cpu" and i % 10 == 0:
            s = Settings.build(prof)  # what a compiled model carries: accepted as loaded
            assert s.knobs_for(torch.device("cpu")) == prof.knobs
            assert s.threads is None or 1 <= s.threads <= props["logical_cpus"]
    # the fuzz reaches every outcome, each many times
    assert min(outcomes.values()) > CASES // 20, outcomes
