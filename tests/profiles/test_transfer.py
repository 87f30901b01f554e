"""Transfer: a device with no profile of its own takes the nearest device class's profile,
adapted, checked by a short A/B (gnncompile.transfer), else the defaults. The measurement is
replaced by a counting stand-in here (the real one trains for seconds); the last test runs the
real check, shrunk, through the command line."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

import gnncompile
from gnncompile import config, profiles, transfer
from gnncompile.hardware import class_distance, device

WL = {"kind": "graphs", "model": "gin", "hidden": 8, "layers": 1, "num_features": 4, "num_classes": 2,
      "compiled": True, "num_graphs": 64, "min_nodes": 4, "max_nodes": 8, "batch_size": 16}


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GNNCOMPILE_TRANSFER", "check")
    yield


def cpu(isa=("avx512f", "avx2", "fma"), cores=2, model="AMD EPYC 9B14", l2=1 << 20, l3=32 << 20, **kw):
    isa = list(isa)
    return {"type": "cpu", "model": model, "machine": "x86_64", "logical_cpus": cores, "physical_cores": cores,
            "threads": cores, "isa": isa, "vector_bits": 512 if any(f.startswith("avx512") for f in isa) else 256,
            "l2_bytes": l2, "l3_bytes": l3, **kw}


def gpu(cc=(9, 0), sms=132, gib=80, name="NVIDIA H100"):
    return {"type": "cuda", "name": name, "capability": list(cc), "sm_count": sms, "memory_bytes": gib << 30,
            "l2_bytes": 50 << 20, "host_logical_cpus": 16}


def save_source(props, settings=None, workload=None, directory=None):
    s = {"knobs": [3, 8], "threads": props.get("physical_cores") or 1, "batch_size": 32, "pool_size": 3,
         "num_workers": 1, "pin_memory": False, "persistent_workers": True, "inner": "aot_eager"}
    s.update(settings or {})
    doc = profiles.make(props, workload or WL, s, tuned=200.0, default=100.0, unit="graphs/s")
    return profiles.save(doc, directory), doc


@pytest.fixture
def resolve_as(monkeypatch):
    """profiles.resolve('auto') on a machine with the properties given."""
    def run(props, check=None):
        monkeypatch.setattr(profiles._device, "detect", lambda dev=None: dict(props))
        return profiles.resolve("auto", workload=WL, check=check)
    return run


class FakeMeasure:
    """Stands in for transfer.measure_pair: the transferred side runs at ``ratio`` times the
    defaults; counts its calls."""

    def __init__(self, ratio):
        self.ratio, self.calls = ratio, 0

    def __call__(self, workload, a, b, rounds, steps, warmup, device):
        self.calls += 1
        base = [100.0 + i for i in range(rounds)]
        return [x * self.ratio for x in base], base, "graphs/s"


@pytest.fixture
def fake(monkeypatch):
    def make(ratio):
        f = FakeMeasure(ratio)
        monkeypatch.setattr(transfer, "measure_pair", f)
        # the compile-time check runs in a child process; here in this one, with the stand-in
        monkeypatch.setattr(profiles, "_run_child", lambda cand, props, limit: transfer.check(cand, props))
        return f
    return make


# ------------------------------------------------------------------------------- distance
def test_cpu_distance_prefers_the_same_isa_class():
    me = cpu()
    other_avx512 = cpu(isa=("avx512_bf16", "avx512f", "avx2"), cores=8, l3=64 << 20)
    avx2 = cpu(isa=("avx2", "fma"))  # same vendor, cores and caches
    assert class_distance(me, me) == 0
    assert class_distance(me, other_avx512) < class_distance(me, avx2)
    assert class_distance(me, avx2) == class_distance(avx2, me)
    sse = cpu(isa=("f16c",))
    arm = cpu(isa=("asimd",), model="Neoverse-V2", machine="aarch64")
    assert class_distance(me, avx2) < class_distance(me, sse) < class_distance(me, arm)
    # then vendor, then cores and caches
    intel = cpu(model="Intel(R) Xeon(R) Platinum 8480")
    assert class_distance(me, cpu(cores=4)) < class_distance(me, intel)
    assert class_distance(me, cpu(cores=4)) < class_distance(me, cpu(cores=16))
    assert class_distance(me, cpu(l2=2 << 20)) < class_distance(me, cpu(l2=8 << 20))


def test_cuda_distance_prefers_the_same_capability():
    h100 = gpu()
    assert class_distance(h100, gpu(sms=114, gib=94, name="NVIDIA H100 PCIe")) < class_distance(h100, gpu(cc=(8, 0)))
    assert class_distance(h100, gpu(cc=(8, 9))) < class_distance(h100, gpu(cc=(7, 5)))
    assert class_distance(gpu(cc=(8, 0)), gpu(cc=(8, 6))) < class_distance(gpu(cc=(8, 0)), gpu(cc=(9, 0)))


def test_never_across_device_types():
    assert class_distance(cpu(), gpu()) is None and class_distance(gpu(), cpu()) is None


# ------------------------------------------------------------------------------- find / resolve
def test_find_takes_the_nearest_class_and_never_a_gpu_profile(tmp_path):
    me = cpu(isa=("avx2", "fma"))
    d = tmp_path / "profiles"
    save_source(gpu(), {"knobs": [8, 0, 0, 64], "threads": None}, directory=d)
    assert profiles.find(WL, me, d) is None  # a CPU never takes a CUDA profile
    save_source(cpu(isa=("f16c",)), {"knobs": [1, 2]}, directory=d)
    save_source(cpu(isa=("avx512f", "avx2")), {"knobs": [5, 2]}, directory=d)
    found = profiles.find(WL, me, d)
    assert found.source == "transfer" and found.transfer["from"] == device.device_key(cpu(isa=("avx512f", "avx2")))
    assert found.knobs == [5, 2] and found.device_key == device.device_key(me)
    assert profiles.find(WL, me, d, transfer=False) is None
    # this device's own profile wins over every transfer
    save_source(me, {"knobs": [7]}, directory=d)
    own = profiles.find(WL, me, d)
    assert own.source == "file" and own.knobs == [7]


def test_another_generation_named_alike_is_a_transfer_not_own(tmp_path):
    """A profile tuned on a CPU a virtual machine names like this one (model, cores, ISA) but with
    half the L3 (two EPYC generations) is not taken as this device's own: it is a transfer
    candidate (checked before use), its cache difference the distance."""
    zen3 = cpu(isa=("avx2", "fma"), model="AMD EPYC", l2=512 << 10, l3=32 << 20)
    zen2 = cpu(isa=("avx2", "fma"), model="AMD EPYC", l2=512 << 10, l3=16 << 20)
    d = tmp_path / "profiles"
    path, _ = save_source(zen3, {"knobs": [6, 2]}, directory=d)
    assert path.name.startswith(device.device_key(zen3) + "__")
    found = profiles.find(WL, zen2, d)
    assert found.source == "transfer" and found.transfer["from"] == device.device_key(zen3)
    assert found.transfer["distance"] == pytest.approx(5.0)  # one doubling of the L3
    assert found.transfer["verdict"] == "unchecked"
    assert profiles.find(WL, zen3, d).source == "file"  # its own device still takes it as its own
    # a profile written on zen2 goes to its own file: zen3's is not replaced
    path2, _ = save_source(zen2, {"knobs": [2, 2]}, directory=d)
    assert path2 != path and path.exists()
    assert profiles.find(WL, zen2, d).knobs == [2, 2] and profiles.find(WL, zen3, d).knobs == [6, 2]


def test_nearest_workload_among_the_nearest_class(tmp_path):
    me = cpu(isa=("avx2", "fma"))
    src = cpu()
    d = tmp_path / "profiles"
    save_source(src, {"knobs": [2]}, workload={**WL, "model": "gcn"}, directory=d)
    save_source(src, {"knobs": [6]}, workload=WL, directory=d)
    assert profiles.find(WL, me, d).knobs == [6]
    assert profiles.find({**WL, "model": "gcn"}, me, d).knobs == [2]


def test_threads_and_workers_rescaled_to_this_machine():
    src, me = cpu(cores=8), cpu(isa=("avx2",), cores=2)
    s, notes = profiles.adapt_settings({"threads": 8, "num_workers": 4, "pool_size": 6, "knobs": [3],
                                        "persistent_workers": True}, src, me)
    assert s["threads"] == 2 and s["num_workers"] == 1 and s["pool_size"] == 3 and s["knobs"] == [3]
    assert any("threads 8 of 8 cores -> 2 of 2" in n for n in notes)
    s, _ = profiles.adapt_settings({"threads": 2, "num_workers": 1}, src, me)
    assert s["threads"] == 1 and s["num_workers"] == 0
    up, _ = profiles.adapt_settings({"threads": 4, "num_workers": 1}, cpu(cores=4), cpu(cores=16))
    assert up["threads"] == 16 and up["num_workers"] == 4
    # a knob list of another device type is dropped (never happens through find: no such pair)
    k, notes = profiles.adapt_settings({"knobs": [8, 0, 0, 64]}, gpu(), me)
    assert k["knobs"] is None and any("dropped" in n for n in notes)


def test_resolve_uses_an_accepted_transfer_and_caches_the_verdict(tmp_path, fake, resolve_as):
    f = fake(1.25)
    me = cpu(isa=("avx2", "fma"), cores=2)
    path, _ = save_source(cpu(cores=4), {"threads": 4, "knobs": [6, 4]})
    prof = resolve_as(me)
    assert f.calls == 1
    assert prof.source == "transfer" and prof.transferred_from == device.device_key(cpu(cores=4))
    assert prof.settings["threads"] == 2 and prof.knobs == [6, 4]
    assert prof.transfer["verdict"] == "accepted" and prof.transfer["ratio"] == pytest.approx(1.25)
    assert "transferred from cpu-amd-epyc-9b14-4c-avx512f-l2-1m-l3-32m, checked: 1.25x the defaults" in prof.label
    vfile = transfer.verdict_path(prof)
    assert vfile.parent == profiles.cache_dir() / "transfer" and vfile.exists()
    v = json.loads(vfile.read_text())
    assert v["accepted"] and len(v["runs"]["transferred"]) == transfer.ROUNDS
    # the second resolve reads the verdict: no measurement
    again = resolve_as(me)
    assert f.calls == 1 and again.transferred_from == prof.transferred_from
    # a re-tuned source profile makes the verdict stale: measured again
    save_source(cpu(cores=4), {"threads": 4, "knobs": [7, 4]})
    resolve_as(me)
    assert f.calls == 2


def test_slower_transfer_rejected_with_the_reason(fake, resolve_as):
    f = fake(0.8)
    me = cpu(isa=("avx2", "fma"))
    save_source(cpu())
    prof = resolve_as(me)
    assert f.calls == 1
    assert prof.is_default and prof.transferred_from is None
    assert prof.settings == profiles.default_profile(me).settings
    assert prof.transfer["verdict"] == "rejected" and "slower than the defaults" in prof.transfer["reason"]
    assert prof.label.startswith("(defaults; transfer from cpu-amd-epyc-9b14-2c-avx512f-l2-1m-l3-32m rejected: median ratio 0.800")


def test_corrupt_verdict_is_ignored_and_measured_again(fake):
    f = fake(1.1)
    me = cpu(isa=("avx2", "fma"))
    save_source(cpu())
    cand = profiles.find(WL, me)
    vfile = transfer.verdict_path(cand)
    vfile.parent.mkdir(parents=True)
    for text in ('{"format": "gnncompile-transfer-verdict", "version": 1, "accepted": "yes"}', "{not json"):
        vfile.write_text(text)
        with pytest.warns(profiles.ProfileWarning, match="ignoring the transfer verdict .*checking again"):
            prof = profiles._checked(cand, me, None)
        assert prof.transfer["verdict"] == "accepted"
    assert f.calls == 2
    assert json.loads(vfile.read_text())["accepted"] is True


def test_modes_cached_and_off(fake):
    f = fake(1.5)
    me = cpu(isa=("avx2", "fma"))
    save_source(cpu())
    cand = profiles.find(WL, me)
    off = profiles._checked(cand, me, "off")
    assert off.is_default and off.transfer["verdict"] == "unchecked" and "GNNCOMPILE_TRANSFER=off" in off.label
    cached = profiles._checked(cand, me, "cached")
    assert cached.is_default and "not checked yet" in cached.transfer["reason"]
    assert f.calls == 0
    profiles._checked(cand, me, "check")
    assert f.calls == 1
    assert profiles._checked(cand, me, "cached").source == "transfer"  # the cached verdict counts
    assert profiles._checked(cand, me, "off").is_default
    with pytest.raises(ValueError, match="transfer check mode"):
        transfer.gate(cand, me, "sometimes")


def test_failed_check_is_a_rejection(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no loader")
    monkeypatch.setattr(transfer, "measure_pair", boom)
    me = cpu(isa=("avx2", "fma"))
    save_source(cpu())
    v = transfer.check(profiles.find(WL, me), me)
    assert v["accepted"] is False and v["reason"] == "the check failed: RuntimeError: no loader"


def test_child_timeout_is_a_rejection(monkeypatch, tmp_path):
    me = cpu(isa=("avx2", "fma"))
    save_source(cpu())
    cand = profiles.find(WL, me)
    monkeypatch.setattr(profiles.sys, "executable", "/bin/sleep")  # "sleep -m ..." fails at once
    v = profiles._run_child(cand, me, 30)
    assert v["accepted"] is False and "the check process failed" in v["reason"]
    script = tmp_path / "slow.sh"
    script.write_text("#!/bin/sh\nsleep 30\n")
    script.chmod(0o755)
    transfer.verdict_path(cand).unlink()
    monkeypatch.setattr(profiles.sys, "executable", str(script))
    v = profiles._run_child(cand, me, 0.5)
    assert v["accepted"] is False and "did not finish within 0.5 s" in v["reason"]


def test_compile_and_explain_show_the_transfer(monkeypatch, fake):
    f = fake(1.2)
    me = device.detect("cpu")
    src = dict(me, isa=["avx512f", "avx2"] if "avx512f" not in me["isa"] else ["avx2", "fma"],
               model="AMD EPYC 7B13")
    save_source(src, {"knobs": [5, 4], "threads": 1, "num_workers": 0, "pool_size": 2,
                      "persistent_workers": False})
    lin = torch.nn.Linear(4, 2)
    m = gnncompile.compile(lin, workload=WL)
    assert f.calls == 1
    assert m.gnncompile_profile.transferred_from == device.device_key(src)
    assert m.gnncompile_settings.knobs_for("cpu") == [5, 4]
    assert "transferred from" in m.gnncompile_settings.profile
    assert "checked: 1.20x the defaults" in str(m.gnncompile_settings)
    report = gnncompile.explain(m, torch.randn(3, 4))
    assert "transferred from " + device.device_key(src) in str(report)


def test_cli_check_transfer(monkeypatch, fake, capsys):
    from gnncompile.cli import main

    f = fake(0.9)
    me = device.detect("cpu")
    src = dict(me, isa=["avx512f", "avx2"] if "avx512f" not in me["isa"] else ["avx2", "fma"],
               model="AMD EPYC 7B13")
    save_source(src)
    assert main(["profile", "check-transfer", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["accepted"] is False and v["ratio"] == pytest.approx(0.9)
    assert main(["profile", "check-transfer"]) == 0 and f.calls == 1  # cached
    assert "rejected" in capsys.readouterr().out
    assert main(["profile", "check-transfer", "--force"]) == 0 and f.calls == 2
    assert main(["profile", "check-transfer", "--rounds", "0"]) == 2
    capsys.readouterr()
    # profile show never measures, and shows the verdict
    assert main(["profile", "show"]) == 0 and f.calls == 2
    shown = json.loads(capsys.readouterr().out)
    assert shown["transfer"]["verdict"] == "rejected" and shown["source"].startswith("(defaults; transfer from")
    profiles.save(profiles.make(me, WL, {"knobs": [2]}))
    assert main(["profile", "check-transfer"]) == 1  # this device has its own now


@pytest.mark.slow
def test_real_check_through_the_cli(capsys):
    """The real measurement (tuner.workloads.interleaved), on a tiny workload, in this process."""
    from gnncompile.cli import main

    me = device.detect("cpu")
    src = dict(me, isa=["avx512f", "avx2"] if "avx512f" not in me["isa"] else ["avx2", "fma"],
               model="AMD EPYC 7B13")
    path, _ = save_source(src, {"knobs": [4, 4], "threads": 1, "num_workers": 0, "pool_size": 2,
                                "persistent_workers": False, "inner": "eager"})
    with config.override(inner="eager"):
        assert main(["profile", "check-transfer", "--source", str(path), "--rounds", "2", "--steps", "2",
                     "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert len(v["runs"]["transferred"]) == 2 and len(v["runs"]["defaults"]) == 2
    assert all(x > 0 for x in v["runs"]["transferred"] + v["runs"]["defaults"])
    assert v["accepted"] == (v["ratio"] >= 1.0) and v["unit"] == "graphs/s"
