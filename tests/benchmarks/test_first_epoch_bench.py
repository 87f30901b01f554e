"""benchmarks.first_epoch: the speed guard's race cost from timed form calls, the medians over
rounds and the table, and one compiled child process on a few small batches (its breakdown adds
up: the backend inside Dynamo's compile, the compile inside the first forward). Speed is not
asserted."""
from __future__ import annotations

import argparse

import pytest

from benchmarks import first_epoch as fe


class _Decision:
    def __init__(self, piece, kept):
        self.piece, self.kept, self.grad = piece, kept, True


def _probes(forms):
    p = fe.Probes.__new__(fe.Probes)  # the timers alone: nothing patched
    p.forms = forms
    return p


def test_race_cost_is_the_losers_time_above_the_winners_median_without_the_compile_call():
    forms = {"model:compiled": [(0, 1.0), (1, 0.004), (3, 0.004), (5, 0.006)],  # call 0: the compile
             "model:eager": [(2, 0.003), (4, 0.003), (6, 0.003), (7, 0.003)]}
    costs = _probes(forms).race_costs([_Decision("the whole model (M)", "eager")])
    m = costs["model"]
    assert m["kept"] == "eager" and m["calls"] == {"eager": 4, "compiled": 3}
    assert m["winner_median_ms"] == pytest.approx(3.0)
    assert m["cost_ms"] == pytest.approx((0.014 - 3 * 0.003) * 1e3)
    # a loser faster per call than the winner's median costs nothing
    forms = {"piece:rewritten": [(1, 0.002), (2, 0.002)], "piece:unrewritten": [(3, 0.005), (4, 0.005)]}
    assert _probes(forms).race_costs([_Decision("piece 1 (x)", "unrewritten")])["piece"]["cost_ms"] == 0.0


def _run(epoch, first, compile_s=None):
    r = {"first_epoch_s": epoch, "first_step_s": first, "rest_s": epoch - first - 0.05, "rest_loader_s": 0.05,
         "step_median_ms": 8.0, "first_loss": 0.7, "first_loss_eager": 0.7,
         "first_step": {"forward_s": first * 0.9, "forward_cpu_s": first * 0.9, "backward_s": first * 0.05,
                        "optimizer_s": first * 0.05}}
    if compile_s is not None:
        r.update({"dynamo_s": {k: compile_s / 2 for k in fe.DYNAMO_KEYS} | {"_compile.compile_inner": compile_s},
                  "gnncompile_s": {"backend": 0.02, "passes": 0.015}, "graph_code": ["abc"], "graph_breaks": 0,
                  "graphs_compiled": 1, "codegen": {"builds": 0, "disk_hits": 1},
                  "races": {"model": {"cost_ms": 2.0}}, "guard": ["the whole model: kept eager"]})
    return r


def test_combine_takes_medians_and_the_ratio_round_by_round_and_the_table_shows_them():
    eager = [_run(0.4, 0.01), _run(0.5, 0.01), {"error": "rc 1: boom"}]
    comp = [_run(1.2, 0.9, 0.8), _run(1.0, 0.7, 0.6), _run(1.4, 1.1, 1.0)]
    c = fe.combine(comp, eager)
    assert c["first_epoch_s"] == pytest.approx(1.2) and c["dynamo_s"]["_compile.compile_inner"] == pytest.approx(0.8)
    assert c["over_eager_first_epoch"] == pytest.approx((1.2 / 0.4 + 1.0 / 0.5) / 2)  # the errored round left out
    assert c["race_cost_ms"] == {"model": 2.0}
    p = {"models": ["gin"], "results": {"gin": {"eager": fe.combine(eager, eager), "gnncompile": c}},
         "graphs": 40, "batch_size": 8, "threads": 2, "rounds": 3, "cpu": "some CPU", "machine": {"torch": "t"},
         "loadavg_before_after": [(0, 0, 0), (1, 1, 1)], "command": "cmd",
         "configs": {"gin": [{"setting": ["k=1"], "with": c, "default": c}]}}
    md = fe.markdown(p)
    assert f"({c['over_eager_first_epoch']:.2f}x eager)" in md and "| -- Dynamo's compile (compile_inner) |  | 800 |" in md
    assert "| gin | `k=1` | 1200 (1200) | 800 (800) |" in md and "| yes | yes | 0 | 1 |" in md
    assert "- gin: the whole model: kept eager" in md and "some CPU" in md


def test_unknown_config_is_refused():
    with pytest.raises(SystemExit, match="unknown config"):
        fe._set_config(["no_such_option_here=1"])


def test_compiled_child_on_small_batches_adds_up(monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_GUARD", "time")  # (the suite turns it off): its forms are timed too
    opts = argparse.Namespace(graphs=40, batch_size=8, threads=1, top=5, dynamo=None, timeout=600)
    r = fe.child("gin", "gnncompile", opts)
    assert "error" not in r, r
    assert r["steps"] == 5 and r["graph_breaks"] == 0 and r["graphs_compiled"] == 1
    assert r["first_loss"] == pytest.approx(r["first_loss_eager"], rel=1e-4)
    d, g = r["dynamo_s"], r["gnncompile_s"]
    # the backend runs inside Dynamo's compile, the compile inside the first forward
    assert 0 < g["passes"] <= g["backend"] <= d["OutputGraph.call_user_compiler"] + 1e-3
    assert d["bytecode_tracing"] < d["_compile.compile_inner"] <= r["first_step"]["forward_s"]
    assert len(r["graph_code"]) == 1 and r["form_calls"]["model:compiled"] >= 1


def test_unknown_variant_or_no_eager_is_refused(capsys):
    for bad in (["--variants", "eager,nope"], ["--variants", "gnncompile"], ["--models", "gat"]):
        with pytest.raises(SystemExit):
            fe.main(bad + ["--rounds", "0"])
    assert "unknown" in capsys.readouterr().err


def test_graph_key_tells_graphs_apart_without_generating_their_code():
    import torch
    from torch.fx._lazy_graph_module import _LazyGraphModule

    def capture(f):
        gms = []
        torch._dynamo.reset()
        torch.compile(f, backend=lambda gm, ex: gms.append((gm, type(gm)._needs_recompile(), fe.graph_key(gm),
                                                             type(gm)._needs_recompile())) or gm.forward)(
            torch.ones(3, 2))
        return gms[0]

    gm, lazy_before, key, lazy_after = capture(lambda x: (x * 2).relu())
    assert isinstance(gm, _LazyGraphModule) and lazy_before and lazy_after  # its code not generated by the key
    assert capture(lambda x: (x * 2).relu())[2] == key  # the same graph again
    assert capture(lambda x: (x * 3).relu())[2] != key  # a constant changed
    assert capture(lambda x: (x * 2).sigmoid())[2] != key  # a target changed
