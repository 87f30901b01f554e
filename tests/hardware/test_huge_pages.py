"""Huge pages for torch's large CPU allocations (gnncompile.hardware.memory,
native/common/huge_pages.cpp): the wrapper marks the whole 2 MB pages inside large allocations
and nothing else, the kernel backs them with huge pages (read back from /proc/self/smaps), values
and deleters stay torch's, compile() turns it on or leaves it per the setting, and bad input is a
clear error. The process-wide parts run in subprocesses, so that this test process's allocator
is the one it started with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnncompile import config
from gnncompile.hardware import memory
from gnncompile.ops import _native
from gnncompile.settings import Settings

needs_native = pytest.mark.skipif(not _native.native_loaded(), reason="the native extension is not loaded")
needs_madvise = pytest.mark.skipif(memory.thp_mode() != "madvise",
                                   reason=f"the kernel's THP mode is {memory.thp_mode()!r}, not 'madvise'")
REPO = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> dict:
    """Runs ``code`` in a fresh interpreter (its last line prints a JSON object) and returns
    that object."""
    e = {**os.environ, **env}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# the smaps entry that holds an address: its AnonHugePages in kB
SMAPS = r"""
def huge_kb(addr):
    cur = None
    for line in open('/proc/self/smaps'):
        head = line.split()
        if len(head) >= 5 and '-' in head[0] and not head[0].endswith(':'):
            lo, hi = (int(v, 16) for v in head[0].split('-'))
            cur = lo <= addr < hi
        elif cur and head[0] == 'AnonHugePages:':
            return int(head[1])
    return None
"""


def test_thp_mode_reads_the_bracketed_word(tmp_path):
    f = tmp_path / "enabled"
    for text, want in [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                       ("always madvise [never]", "never"), ("garbage", None)]:
        f.write_text(text)
        assert memory.thp_mode(f) == want
    assert memory.thp_mode(tmp_path / "absent") is None


def test_the_setting_and_its_variable_are_checked():
    assert Settings().huge_pages == "auto"
    assert Settings().replace(choices={"huge_pages": "off"}).huge_pages == "off"
    with pytest.raises(ValueError, match="huge_pages"):
        Settings().replace(choices={"huge_pages": "on"})
    with config.override(huge_pages="off"):
        assert Settings.from_config().huge_pages == "off"
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_HUGE_PAGES"):
        config.VARIABLES[[v.name for v in config.VARIABLES].index("GNNCOMPILE_HUGE_PAGES")].parse(
            "GNNCOMPILE_HUGE_PAGES", "yes")
    with pytest.raises(ValueError, match="huge_pages"):
        memory.apply("on", {"cpu"})


@needs_native
def test_bad_threshold_is_a_clear_error():
    before = memory.status()
    with pytest.raises(ValueError, match="2 MiB"):
        memory.enable(4096)
    with pytest.raises(TypeError, match="threshold"):
        memory.enable(2.5e6)
    with pytest.raises(TypeError, match="threshold"):
        memory.enable(True)
    after = memory.status()
    # the refusals changed nothing (this process may have it on from a compile in another test)
    assert (after["installed"], after["threshold"]) == (before["installed"], before["threshold"])


@needs_native
@needs_madvise
def test_large_allocations_get_huge_pages_and_keep_their_values():
    out = _run(SMAPS + r"""
import json, torch
from gnncompile.hardware import memory
n = 24 << 20                                    # 24 MiB: above glibc's mmap threshold at first
before = torch.empty(n // 4).fill_(1.0)         # torch's allocator as it is: 4 KB pages
memory.enable()
small = torch.ones(1000)                        # under the threshold: not advised
calls0 = memory.status()['advised_calls']
x = torch.arange(n // 4, dtype=torch.float32)   # advised, then written (faulted in)
st = memory.status()
res = dict(calls=st['advised_calls'] - calls0, bytes=st['advised_bytes'], failures=st['failures'],
           huge_x=huge_kb(x.data_ptr() + (8 << 20)), huge_before=huge_kb(before.data_ptr() + (8 << 20)),
           ok=bool((x[:5] == torch.arange(5.0)).all()) and float(x[-1]) == n // 4 - 1,
           clone=bool(torch.equal(x.clone(), x)), small=float(small.sum()))
del x, before
calls1 = memory.status()['advised_calls']       # x and its clone
res['disabled'] = memory.disable()
y = torch.ones(n // 4)
res['with_clone'] = calls1 - calls0
res['after'] = memory.status()['advised_calls'] - calls1
res['installed'] = memory.status()['installed']
print(json.dumps(res))
""")
    assert out["calls"] == 1 and out["failures"] == 0, out
    assert (24 << 20) - 2 * (2 << 20) <= out["bytes"] <= 24 << 20, out  # whole 2 MB pages inside
    # the madvised interior is a mapping of its own (madvise splits it off), backed by huge pages
    assert out["huge_x"] is not None and out["huge_x"] >= 4 * 2048, out
    assert out["huge_before"] == 0, out  # the allocation made before: 4 KB pages
    assert out["ok"] and out["clone"] and out["small"] == 1000.0, out
    assert out["with_clone"] == 2, out
    assert out["disabled"] and out["after"] == 0 and not out["installed"], out  # y: not advised


@needs_native
@needs_madvise
def test_compile_turns_it_on_for_a_cpu_model_and_the_setting_leaves_it_off():
    """In one process: a model compiled with the setting 'off' leaves the allocator alone, the
    next one compiled with the default turns it on; with GNNCOMPILE_HUGE_PAGES=off (another
    process) neither gnncompile.compile nor the registered backend turns it on."""
    code = r"""
import json, torch, gnncompile
from gnncompile.hardware import memory
from torch_geometric.nn.models import GCN
x, ei = torch.randn(30, 8), torch.randint(0, 30, (2, 90))
def run(settings):
    m = GCN(8, 8, 2, 4)
    c = gnncompile.compile(m, settings=settings)
    same = bool(torch.allclose(c(x, ei), m(x, ei), atol=1e-5))
    rep = gnncompile.explain(c, x, ei)
    return dict(line=c.gnncompile_huge_pages, installed=memory.status()['advise'], same=same,
                explain=[l for l in str(rep).splitlines() if l.startswith('huge pages:')],
                as_dict=rep.as_dict()['huge_pages'])
off = run({"choices": {"huge_pages": "off"}})
on = run(None)
m = GCN(8, 8, 2, 4)
backend_same = bool(torch.allclose(torch.compile(m, backend="gnncompile")(x, ei), m(x, ei), atol=1e-5))
print(json.dumps(dict(off=off, on=on, backend_same=backend_same, installed=memory.status()['advise'])))
"""
    first = _run(code)
    off, on = first["off"], first["on"]
    assert not off["installed"] and off["line"].startswith("off") and off["same"], off
    assert on["installed"] and on["line"].startswith("on ("), on
    assert on["explain"] == [f"huge pages: {on['line']}"] and on["as_dict"] == on["line"] and on["same"], on
    env_off = _run(code, GNNCOMPILE_HUGE_PAGES="off")
    for r in (env_off["off"], env_off["on"]):
        assert not r["installed"] and r["line"].startswith("off") and r["same"], env_off
    assert env_off["backend_same"] and not env_off["installed"], env_off  # the backend too


def test_apply_leaves_a_model_off_the_cpu_and_kernels_without_madvise_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "enable", lambda *a, **k: calls.append(a) or True)
    assert memory.apply("auto", {"cuda"}).startswith("auto: not used (the model is not on the CPU)")
    for mode, want in [("always", "'always' on"), ("never", "not available (transparent huge pages never)"),
                       (None, "not reported")]:
        monkeypatch.setattr(memory, "thp_mode", lambda m=mode: m)
        assert want in memory.apply("auto", {"cpu"})
    assert calls == []  # none of them installed anything
    monkeypatch.setattr(memory, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(memory, "_binding", lambda: type("B", (), {"state": staticmethod(
        lambda: {"threshold": 2 << 20, "installed": True, "advise": True})}))
    assert memory.apply("auto", {"cpu"}).startswith("on (")
    assert calls == [()]


def test_without_the_extension_it_says_why(monkeypatch):
    monkeypatch.setattr(_native, "_C", None)
    st = memory.status()
    assert st["installed"] is False and "not loaded" in st["unavailable"]
    with pytest.raises(memory.HugePagesUnavailable, match="not loaded"):
        memory.enable()
    monkeypatch.setattr(memory, "thp_mode", lambda: "madvise")
    assert "not available" in memory.apply("auto", {"cpu"})
    # a model still compiles and runs
    assert torch.ones(2).sum() == 2


@needs_native
@needs_madvise
def test_the_registered_backend_turns_it_on_at_its_first_cpu_compile():
    code = r"""
import json, torch, gnncompile
from gnncompile.hardware import memory
from torch_geometric.nn.models import GCN
m = GCN(8, 8, 2, 4)
c = torch.compile(m, backend="gnncompile")
before = memory.status()['advise']
x, ei = torch.randn(30, 8), torch.randint(0, 30, (2, 90))
same = bool(torch.allclose(c(x, ei), m(x, ei), atol=1e-5))
print(json.dumps(dict(before=before, after=memory.status()['advise'], same=same)))
"""
    on = _run(code)  # (with GNNCOMPILE_HUGE_PAGES=off it stays off: the test above)
    assert on == {"before": False, "after": True, "same": True}, on
