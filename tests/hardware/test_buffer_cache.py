"""The block cache of freed large CPU allocations (gnncompile.hardware.memory, choices['buffer_cache'],
native/common/huge_pages.cpp): a freed block is handed out again for a request of its size, never
while anything still holds it (a view, a numpy array, autograd's saved tensors, a retained output);
the idle bytes stay under the cap (oldest evicted first); training with it is bit for bit
training without it; compile() and explain() say whether it is on; bad settings are clear errors.
The process-wide parts run in fresh interpreters, so that this test process's allocator is the one
it started with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnncompile import config
from gnncompile.hardware import memory
from gnncompile.ops import _native
from gnncompile.settings import Settings

needs_native = pytest.mark.skipif(not _native.native_loaded(), reason="the native extension is not loaded")
REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _run(code: str, **env: str) -> dict:
    """Runs ``code`` in a fresh interpreter (its last line prints a JSON object) and returns it."""
    e = {**os.environ, **env}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_setting_and_its_variable_are_checked():
    assert Settings().buffer_cache == "auto"
    assert Settings().replace(choices={"buffer_cache": "off"}).buffer_cache == "off"
    assert Settings().replace(choices={"buffer_cache": 512}).buffer_cache == 512
    assert Settings().replace(choices={"buffer_cache": "512"}).buffer_cache == 512  # canonical: the int
    assert Settings().replace(choices={"buffer_cache": "auto"}) == Settings()  # the default is not stored
    for bad in ("on", "", -1, 0, True, 1.5, "1.5", None):
        with pytest.raises(ValueError, match=r"buffer_cache.*expected auto, off or a cap in MiB"):
            Settings().replace(choices={"buffer_cache": bad})
    with config.override(buffer_cache="off"):
        assert Settings.from_config().buffer_cache == "off"
    var = config.VARIABLES[[v.name for v in config.VARIABLES].index("GNNCOMPILE_BUFFER_CACHE")]
    assert var.parse("GNNCOMPILE_BUFFER_CACHE", " 256 ") == 256
    assert var.parse("GNNCOMPILE_BUFFER_CACHE", "OFF") == "off"
    assert var.parse("GNNCOMPILE_BUFFER_CACHE", "") == "auto"
    for bad in ("yes", "-3", "0", "1e9"):
        with pytest.raises(config.ConfigError, match="GNNCOMPILE_BUFFER_CACHE"):
            var.parse("GNNCOMPILE_BUFFER_CACHE", bad)
    with pytest.raises(ValueError, match="buffer_cache"):
        memory.apply_cache("on", {"cpu"})
    assert memory.cache_cap("off") == 0 and memory.cache_cap(3) == 3 * MiB
    assert memory.cache_cap("auto") == memory.default_cache_cap()


def test_the_auto_cap_is_a_share_of_memory_with_a_ceiling(monkeypatch):
    monkeypatch.setattr(memory, "physical_memory", lambda: 8 << 30)
    assert memory.default_cache_cap() == (8 << 30) // memory.CACHE_CAP_SHARE
    monkeypatch.setattr(memory, "physical_memory", lambda: 1 << 40)
    assert memory.default_cache_cap() == memory.CACHE_CAP_MAX
    monkeypatch.setattr(memory, "physical_memory", lambda: None)
    assert 0 < memory.default_cache_cap() <= memory.CACHE_CAP_MAX


@needs_native
def test_bad_arguments_are_clear_errors_and_change_nothing():
    before = memory.status()
    with pytest.raises(TypeError, match="cap must be an int"):
        memory.enable_cache(1.5e9)
    with pytest.raises(TypeError, match="cap must be an int"):
        memory.enable_cache(True)
    with pytest.raises(ValueError, match="cap must be > 0"):
        memory.enable_cache(0)
    with pytest.raises(TypeError, match="min_bytes must be an int"):
        memory.enable_cache(MiB, min_bytes="4096")
    with pytest.raises(ValueError, match="min_bytes must be >= 4096"):
        memory.enable_cache(MiB, min_bytes=100)
    for bad in (0, -1.0, float("nan"), "30", True):
        with pytest.raises(ValueError, match="max_idle_s must be a number of seconds"):
            memory.enable_cache(MiB, max_idle_s=bad)
    with pytest.raises(ValueError, match="max_idle_s must be > 0"):
        _native._C.huge_pages.set_cache(MiB, 4096, 0.0)
    with pytest.raises(ValueError, match="cap must be >= 0"):
        _native._C.huge_pages.set_cache(-1, 4096)
    with pytest.raises(ValueError, match="keep must be >= 0"):
        _native._C.huge_pages.trim(-1)
    after = memory.status()
    assert {k: after[k] for k in ("installed", "cache_cap", "cache_min_bytes")} == \
        {k: before[k] for k in ("installed", "cache_cap", "cache_min_bytes")}


@needs_native
def test_a_block_is_reused_only_once_nothing_holds_it():
    """A freed block comes back for the next request of its size; a block that a view, a numpy
    array, autograd's saved tensors or a retained tensor still holds is never handed out, and
    the values held there stay as they were."""
    out = _run(r"""
import json, os, torch
from gnncompile.hardware import memory
memory.enable_cache(64 << 20, min_bytes=1 << 20)
n = (4 << 20) // 4                                 # 4 MiB of float32
res = {}
a = torch.empty(n).fill_(1.0); pa = a.data_ptr()
del a
b = torch.empty(n); res['reused'] = b.data_ptr() == pa       # the freed block, at once
b.fill_(2.0)
view = b[10:]; del b                               # the view holds the storage
c = torch.empty(n).fill_(3.0)
res['view_kept'] = c.data_ptr() != pa and bool((view == 2.0).all())
arr = c.numpy(); pc = c.data_ptr(); del c          # numpy holds it
d = torch.empty(n).fill_(4.0)
res['numpy_kept'] = d.data_ptr() not in (pa, pc) and bool((arr == 3.0).all())
del d
w = torch.randn(n, requires_grad=True)
y = (w * w).sum()                                  # autograd saves w (and its storage)
retained = torch.exp(torch.ones(n))                # an output the caller keeps
ref = retained.clone()
wref = w.detach().clone()
for _ in range(5):                                 # churn: every size class in and out of the cache
    junk = [torch.empty(n).fill_(9.0) for _ in range(4)]
    del junk
y.backward()
res['saved_ok'] = bool(torch.equal(w.grad, 2 * wref))
res['retained_ok'] = bool(torch.equal(retained, ref))
res['view_still'] = bool((view == 2.0).all()) and bool((arr == 3.0).all())
st = memory.status()
res.update(hits=st['cache_hits'], live=st['cache_live_blocks'])
# a forked child (a loader worker) allocates and frees through the cache and exits cleanly
pid = os.fork()
if pid == 0:
    torch.set_num_threads(1)                       # (OpenMP is not fork-safe; loaders do the same)
    t = torch.empty(n).fill_(5.0); ok = float(t[-1]) == 5.0; del t
    t = torch.empty(n); del t
    os._exit(0 if ok else 3)
res['fork_rc'] = os.waitpid(pid, 0)[1]
print(json.dumps(res))
""")
    assert out["reused"], out
    assert out["view_kept"] and out["numpy_kept"], out
    assert out["saved_ok"] and out["retained_ok"] and out["view_still"], out
    assert out["hits"] >= 10 and out["live"] >= 4, out  # the churn ran on the cache; view, arr, w, retained live
    assert out["fork_rc"] == 0, out


@needs_native
def test_the_cap_bounds_the_idle_bytes_oldest_first_and_unused_blocks_expire():
    out = _run(r"""
import json, time, torch
from gnncompile.hardware import memory
MiB = 1 << 20
memory.enable_cache(3 * MiB, min_bytes=4096)
ts = [torch.empty(MiB // 4) for _ in range(6)]   # six 1 MiB blocks
ptrs = [t.data_ptr() for t in ts]
for i in range(6):                                # freed in order: the first three are evicted
    ts[i] = None
st = memory.status()
res = dict(held=st['cache_held'], idle=st['cache_idle_blocks'], evicted=st['cache_evictions'], peak=st['cache_held_peak'])
again = [torch.empty(MiB // 4) for _ in range(3)]
res['newest_kept'] = sorted(t.data_ptr() for t in again) == sorted(ptrs[3:])
big = torch.empty(4 * MiB // 4); del big          # larger than the cap: freed at once
res['released'] = memory.status()['cache_released']
del again
memory.enable_cache(2 * MiB, min_bytes=4096)      # a smaller cap frees the oldest now
res['held_after_shrink'] = memory.status()['cache_held']
res['emptied'] = memory.empty_cache()
res['held_after_empty'] = memory.status()['cache_held']
x = torch.empty(MiB // 4); del x
memory.enable_cache(2 * MiB, min_bytes=4096, max_idle_s=0.2)   # idle blocks expire after 0.2 s
time.sleep(0.3)
z = torch.empty(2 * MiB // 4); del z              # a miss and a free: the 1 MiB block has expired
st = memory.status()
res.update(expired=st['cache_expired'], held_after_expiry=st['cache_held'], max_idle=st['cache_max_idle_s'])
memory.disable_cache()                            # off: emptied, later frees go straight back
y = torch.empty(MiB // 4); del y
st = memory.status()
res.update(off_cap=st['cache_cap'], off_held=st['cache_held'])
print(json.dumps(res))
""")
    assert out["held"] == 3 * MiB and out["idle"] == 3 and out["evicted"] == 3 and out["peak"] <= 3 * MiB, out
    assert out["newest_kept"], out
    assert out["released"] == 1, out
    assert out["held_after_shrink"] <= 2 * MiB and out["emptied"] == out["held_after_shrink"], out
    assert out["held_after_empty"] == 0, out
    assert out["expired"] == 1 and out["held_after_expiry"] == 2 * MiB and out["max_idle"] == pytest.approx(0.2), out
    assert out["off_cap"] == 0 and out["off_held"] == 0, out


# one process trains GCN, GraphSAGE and GIN compiled, and prints every loss and the final
# parameters' bits (guard off: what runs does not depend on timing)
TRAIN = r"""
import hashlib, json, sys, torch, gnncompile
from gnncompile.hardware import memory
from torch_geometric.nn import models
from gnncompile.data.synthetic import power_law_graph
cache = sys.argv[1]
torch.set_num_threads(2)
if cache == "on":
    memory.enable_cache(256 << 20, min_bytes=4096)   # every tensor of this small graph through the cache
N, F = 3000, 32
ei = power_law_graph(N, N * 10, seed=0)
torch.manual_seed(1)
x, y = torch.randn(N, F), torch.randint(0, 8, (N,))
res = {}
for name in ("GCN", "GraphSAGE", "GIN"):
    torch.manual_seed(0)
    model = getattr(models, name)(F, 64, 2, 8)
    run = gnncompile.compile(model, settings={"choices": {"guard": "off", "buffer_cache": "off"}})
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, kept = [], None
    for step in range(6):
        opt.zero_grad()
        out = run(x, ei)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
        if step == 1:
            kept, ref = out, out.detach().clone()     # a retained output of an earlier step
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    res[name] = dict(losses=losses, params=h.hexdigest(), kept_ok=bool(torch.equal(kept.detach(), ref)))
st = memory.status()
res['hits'] = st.get('cache_hits', 0)
print(json.dumps(res))
"""


@needs_native
def test_training_is_bit_equal_with_the_cache_on_and_off():
    off = _run(TRAIN.replace("sys.argv[1]", "'off'"))
    on = _run(TRAIN.replace("sys.argv[1]", "'on'"))
    assert off["hits"] == 0 and on["hits"] > 100, (off["hits"], on["hits"])
    for name in ("GCN", "GraphSAGE", "GIN"):
        assert on[name]["losses"] == off[name]["losses"], name
        assert on[name]["params"] == off[name]["params"], name
        assert on[name]["kept_ok"] and off[name]["kept_ok"], name


@needs_native
def test_compile_turns_it_on_for_a_cpu_model_and_explain_says_so():
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
    return dict(line=c.gnncompile_buffer_cache, cap=memory.status()['cache_cap'], same=same,
                explain=[l for l in str(rep).splitlines() if l.startswith('buffer cache:')],
                as_dict=rep.as_dict()['buffer_cache'])
off = run({"choices": {"buffer_cache": "off"}})
on = run(None)
capped = run({"choices": {"buffer_cache": 64}})
again_off = run({"choices": {"buffer_cache": "off"}})
print(json.dumps(dict(off=off, on=on, capped=capped, again_off=again_off, auto=memory.default_cache_cap())))
"""
    out = _run(code)
    off, on, capped, again_off = out["off"], out["on"], out["capped"], out["again_off"]
    assert off["cap"] == 0 and off["line"] == "off" and off["same"] and off["explain"] == ["buffer cache: off"], off
    assert on["cap"] == out["auto"] and on["line"].startswith("on (") and on["same"], on
    assert on["explain"] == [f"buffer cache: {on['line']}"] and on["as_dict"] == on["line"], on
    assert capped["cap"] == 64 * MiB and "at most 64 MiB idle, set by the settings" in capped["line"], capped
    assert again_off["cap"] == 64 * MiB and "yet on in this process" in again_off["line"], again_off
    env_off = _run(code, GNNCOMPILE_BUFFER_CACHE="off")
    assert env_off["on"]["cap"] == 0 and env_off["on"]["line"] == "off", env_off


def test_a_model_off_the_cpu_and_a_missing_extension_are_left_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "enable_cache", lambda *a, **k: calls.append(a) or True)
    assert memory.apply_cache("auto", {"cuda"}).startswith("auto: not used (the model is not on the CPU)")
    assert calls == []
    monkeypatch.undo()
    monkeypatch.setattr(_native, "_C", None)
    assert "not available" in memory.apply_cache("auto", {"cpu"})
    assert memory.apply_cache("off", {"cpu"}) == "off"
    assert memory.empty_cache() == 0


def test_sizes_in_the_explain_line_are_words():
    assert memory._size(256 << 10) == "256 KiB"
    assert memory._size(2 << 20) == "2 MiB"
    assert memory._size(3 << 19) == "1536 KiB"  # not a whole MiB


@needs_native
def test_node_sized_tensors_of_a_small_graph_step_come_from_the_cache():
    """With compile()'s default settings a freed node-sized tensor of a molecule batch (~3.3k nodes
    x 64 float32, 0.8 MiB: below a huge page) is handed out again for the next one of its size, or
    up to 1/8 smaller (the next batch's), instead of going back to glibc, which trims its heap's top
    after a step so that such blocks were faulted in again every step; a block below
    DEFAULT_CACHE_MIN stays glibc's."""
    out = _run(r"""
import json, torch, gnncompile
from gnncompile.hardware import memory
from torch_geometric.nn.models import GIN
m = gnncompile.compile(GIN(8, 8, 2, 4))
line = m.gnncompile_buffer_cache
st0 = memory.status()
a = torch.empty(3304, 64); pa = a.data_ptr(); del a
b = torch.empty(3213, 64); reused = b.data_ptr() == pa; del b   # the next batch's size: same block
st1 = memory.status()
small = torch.empty(memory.DEFAULT_CACHE_MIN // 4 - 64); del small
st2 = memory.status()
print(json.dumps(dict(line=line, min=st0['cache_min_bytes'], default=memory.DEFAULT_CACHE_MIN, reused=reused,
                      hits=st1['cache_hits'] - st0['cache_hits'], misses=st1['cache_misses'] - st0['cache_misses'],
                      small=(st2['cache_hits'] - st1['cache_hits'], st2['cache_misses'] - st1['cache_misses']))))
""")
    assert out["min"] == out["default"] == 256 << 10, out
    assert out["reused"] and out["hits"] == 1 and out["misses"] == 1, out
    assert out["small"] == [0, 0], out
    assert out["line"].startswith("on (freed CPU allocations of >= 256 KiB kept for reuse"), out


@needs_native
def test_memory_profiled_inside_cache_suspended_sees_every_allocation():
    """torch.profiler's memory report misses a block the cache hands out again; inside
    memory.cache_suspended() the cache is off (the profiler sees the allocation) and afterwards it is
    on again with the cap, minimum and idle limit it had; where the cache is off it is a no-op."""
    out = _run(r"""
import json, torch
from gnncompile.hardware import memory
def seen():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        t = torch.ones(1 << 18); del t                   # 1 MiB: cached once freed
    return max([e.cpu_memory_usage for e in prof.events()] + [0])
with memory.cache_suspended():                           # the cache off: nothing to do
    off = memory.status()['cache_cap']
memory.enable_cache(64 << 20, min_bytes=512 << 10, max_idle_s=7.0)
t = torch.ones(1 << 18); del t                          # the block is in the cache now
hidden = seen()                                          # handed out again: the profiler misses it
st0 = memory.status()
with memory.cache_suspended():
    inside = memory.status()['cache_cap']
    shown = seen()
st1 = memory.status()
print(json.dumps(dict(off=off, hidden=hidden, shown=shown, inside=inside,
                      before=[st0['cache_cap'], st0['cache_min_bytes'], st0['cache_max_idle_s']],
                      after=[st1['cache_cap'], st1['cache_min_bytes'], st1['cache_max_idle_s']])))
""")
    assert out["off"] == 0, out
    assert out["hidden"] < 1 << 20 <= out["shown"], out  # the check can fail: outside, the profiler misses it
    assert out["inside"] == 0, out
    assert out["before"] == out["after"] == [64 << 20, 512 << 10, 7.0], out
