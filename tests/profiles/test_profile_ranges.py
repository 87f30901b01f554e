"""Every profile setting has a documented range on this machine (issue 14, points 1 and 8): a
value above it is clamped with a ProfileWarning saying so; one of the wrong type or below it
makes the profile unusable (ProfileWarning + defaults). The ranges agree with the kernels'
own bounds (native/cpu/glue.h; the CUDA ones are read from native/cuda/knobs.h through the
extension)."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from gnncompile import profiles
from gnncompile.hardware import device
from gnncompile.ops._native import native_loaded
from gnncompile.settings import Settings

NATIVE = Path(__file__).resolve().parents[2] / "native"
CPU = {**device.detect("cpu"), "logical_cpus": 2, "physical_cores": 2}
CUDA = {"type": "cuda", "name": "NVIDIA A100-SXM4-40GB", "capability": [8, 0], "sm_count": 108,
        "memory_bytes": 40 << 30, "l2_bytes": 40 << 20, "host_logical_cpus": 16}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _doc(props, **settings):
    s = {"knobs": [4], "threads": 1, "batch_size": 64, "pool_size": 3, "num_workers": 0,
         "pin_memory": False, "persistent_workers": False}
    s.update(settings)
    return profiles.make(props, {"kind": "graphs", "model": "gin"}, s)


def _load(props, **settings):
    """The profile of a file holding ``settings`` and the ProfileWarnings loading it gave."""
    doc = _doc(props, **settings)
    path = profiles.profile_dir() / profiles.default_filename(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))  # as written by hand: save() refuses what cannot load
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prof = profiles.load_file(path, props)
    return prof, [str(x.message) for x in w if issubclass(x.category, profiles.ProfileWarning)]


def test_ranges_follow_the_machine():
    r = profiles.setting_ranges(CPU)
    assert r == {"threads": (1, 2), "num_workers": (0, 4), "pool_size": (1, 8), "batch_size": (1, 2**20)}
    r = profiles.setting_ranges({**CPU, "logical_cpus": 64})
    assert r["threads"] == (1, 64) and r["num_workers"] == (0, 128) and r["pool_size"] == (1, 130)
    assert profiles.setting_ranges(CUDA)["threads"] == (1, 16)  # the host's CPUs
    assert profiles.knob_ranges("cpu") == [(0, 4096), (0, 64), (0, 2**22)]
    # The CUDA bounds are the launch rule's, read from the extension (None without it).
    cuda = [(0, 32), (0, 256), (0, 16), (0, 2**20)] if native_loaded() else None
    assert profiles.knob_ranges("cuda") == cuda


@pytest.mark.parametrize("knob", [2**62, 2**70, 10**30, 4097])
def test_huge_cpu_knob_is_clamped_with_a_warning(knob):
    """[2**62] was applied as it was (the next forward segfaulted at 2 threads); [2**70] gave an
    unreadable error when a graph compiled (it does not fit the ops' int[] knobs)."""
    prof, msgs = _load(CPU, knobs=[knob])
    assert not prof.is_default and prof.knobs == [4096]
    assert any(f"settings.knobs[0] = {knob} is above its range [0, 4096]" in m and "clamped to 4096" in m
               for m in msgs), msgs
    assert Settings.build(prof).knobs_for("cpu") == [4096]  # what a compiled model bakes in


@pytest.mark.parametrize("field,value,clamped", [
    ("threads", 10000, 2), ("num_workers", 10**6, 4), ("pool_size", 10**9, 8),
    ("batch_size", 2**40, 2**20), ("threads", 2**80, 2)])
def test_absurd_settings_are_clamped(field, value, clamped):
    prof, msgs = _load(CPU, **{field: value})
    assert not prof.is_default and prof.settings[field] == clamped
    assert any(f"settings.{field} = {value} is above its range" in m for m in msgs), msgs
    other = {k: v for k, v in _doc(CPU)["settings"].items() if k != field}
    assert {k: prof.settings[k] for k in other} == other  # the rest as written


def test_clamped_threads_are_what_the_settings_carry():
    prof, _ = _load(CPU, threads=10000)
    assert Settings.build(prof).threads == 2


@pytest.mark.skipif(not native_loaded(), reason="the CUDA bounds are read from the native extension "
                    "(tests/hardware/test_cuda_knobs.py checks what loading does without it)")
def test_cuda_knobs_clamped_to_the_kernels_bounds_and_extra_entries_dropped(monkeypatch):
    prof, msgs = _load(CUDA, knobs=[64, 10**6, 2**40, 2**62, 7, 9], threads=None)
    assert prof.knobs == [32, 256, 16, 2**20]
    assert any("settings.knobs has 6 entries, the cuda kernels read 4" in m for m in msgs), msgs
    prof, msgs = _load(CUDA, knobs=[8, 0, 4, 512], threads=None)
    assert prof.knobs == [8, 0, 4, 512] and msgs == []


@pytest.mark.parametrize("bad", [{"threads": 0}, {"pool_size": 0}, {"batch_size": -5}, {"knobs": [3, -1]},
                                 {"knobs": [2.5]}, {"num_workers": True}, {"knobs": {"0": 4}},
                                 {"batch_size": float("nan")}, {"threads": "8"}])
def test_below_range_or_ill_typed_falls_back_to_defaults(bad):
    prof, msgs = _load(CPU, **bad)
    assert prof.is_default and any("corrupt" in m for m in msgs), msgs


def test_in_range_profile_loads_silently():
    prof, msgs = _load(CPU, threads=2, num_workers=4, pool_size=8, batch_size=2**20, knobs=[4096])
    assert msgs == [] and not prof.is_default
    assert prof.loader_kwargs() == {"batch_size": 2**20, "pool_size": 8, "num_workers": 4,
                                    "pin_memory": False, "persistent_workers": False}


def test_dict_profile_is_clamped_too(monkeypatch):
    monkeypatch.setattr(device, "detect", lambda *a, **k: dict(CPU))
    with pytest.warns(profiles.ProfileWarning, match=r"given as a dict.*settings.threads = 99"):
        prof = profiles.resolve(_doc(CPU, threads=99))
    assert prof.settings["threads"] == 2


@pytest.mark.parametrize("props", [CPU, {**CPU, "logical_cpus": 1, "physical_cores": 1},
                                   {**CPU, "logical_cpus": 96, "physical_cores": 48}, CUDA,
                                   {**CUDA, "host_logical_cpus": 1}])
def test_default_settings_are_within_the_ranges(props):
    prof = profiles.default_profile(props)
    _, notes = profiles.check_settings(prof.settings, props, props["type"])
    assert notes == []


def test_cpu_bound_agrees_with_the_native_code():
    """The CUDA bounds come from the extension itself (cuda_knobs.EXPLICIT_KNOB_MAX, checked against
    the rule's behaviour in tests/hardware/test_cuda_knobs.py); the CPU one is still a Python constant."""
    glue = (NATIVE / "cpu" / "glue.h").read_text()
    assert re.search(r"kMaxChunksPerThread = (\d+);", glue).group(1) == str(profiles.CPU_MAX_CHUNKS_PER_THREAD)
    assert re.search(r"kMaxPrefetchDistance = (\d+);", glue).group(1) == str(profiles.CPU_MAX_PREFETCH_DISTANCE)
    shift = re.search(r"kMaxBlockBudgetKiB = int64_t\(1\) << (\d+);", glue).group(1)
    assert 2 ** int(shift) == profiles.CPU_MAX_BLOCK_BUDGET_KIB


def test_clamped_file_is_left_as_it_was():
    """Loading clamps the Profile, never the user's file."""
    path = profiles.save(_doc(CPU, threads=10000))
    before = path.read_bytes()
    with pytest.warns(profiles.ProfileWarning):
        profiles.load_file(path, CPU)
    assert path.read_bytes() == before and json.loads(before)["settings"]["threads"] == 10000
