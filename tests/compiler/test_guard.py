"""The speed guard (gnncompile.compiler.guard): each rewritten graph piece is timed against its
unrewritten form on its first calls, per size class, and the faster form is kept.

The unit tests give the guard two forms whose costs differ by design (sleeps of tens of
milliseconds, far above this machine's noise), so the choice it must make is known; the model
tests check the wiring: a compiled model's pieces are guarded, outputs and gradients equal
eager's during and after the race, decisions reach explain(), 'off' turns it off."""
from __future__ import annotations

import time

import pytest
import torch

import gnncompile
from gnncompile import config
from gnncompile.compiler import guard as G
from gnncompile.settings import Settings

SLOW = 0.02  # seconds: the slower form's extra cost per call


class _Slow(torch.autograd.Function):
    """Identity whose forward and backward sleep for given times."""

    @staticmethod
    def forward(ctx, x, fwd, bwd):
        ctx.bwd = bwd
        time.sleep(fwd)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.bwd)
        return g * 2, None, None


def _form(fwd: float, bwd: float, calls: list, name: str):
    def run(x, w, ei):
        calls.append(name)
        return (_Slow.apply(x * w, fwd, bwd),)
    return run


def _args(n=100, e=300, grad=True):
    x = torch.randn(n, 4)
    w = torch.nn.Parameter(torch.ones(4)) if grad else torch.ones(4)
    return x, w, torch.randint(0, n, (2, e))


def _drive(g, calls=2 + 2 * G.SAMPLES + 3, backward=True, **kw):
    for _ in range(calls):
        x, w, ei = _args(**kw)
        out = g(x, w, ei)
        if backward:
            out[0].sum().backward()


def test_keeps_the_form_with_the_faster_forward_without_grad():
    calls = []
    g = G.SpeedGuard(_form(SLOW, 0, calls, "rw"), _form(0, 0, calls, "plain"), "piece t")
    with torch.no_grad():
        _drive(g, backward=False, grad=False)
    assert [d.kept for d in g.decisions] == [G.UNREWRITTEN]
    race = 2 + 2 * G.SAMPLES
    assert calls[:race].count("rw") == calls[:race].count("plain") == 1 + G.SAMPLES
    assert calls[race:] == ["plain"] * 3  # only the kept form from then on
    d = g.decisions[0]
    assert not d.grad and d.rewritten_ms > d.unrewritten_ms + 10


def test_backward_time_is_counted():
    # forward alone favours 'rw' (plain sleeps 10 ms in forward), forward + backward favours
    # 'plain' (rw sleeps 20 ms in backward)
    calls = []
    g = G.SpeedGuard(_form(0, SLOW, calls, "rw"), _form(SLOW / 2, 0, calls, "plain"), "piece t")
    _drive(g)
    assert [d.kept for d in g.decisions] == [G.UNREWRITTEN]
    assert g.decisions[0].grad and g.decisions[0].rewritten_ms > g.decisions[0].unrewritten_ms
    calls.clear()
    g = G.SpeedGuard(_form(0, 0, calls, "rw"), _form(0, SLOW, calls, "plain"), "piece t")
    _drive(g)
    assert [d.kept for d in g.decisions] == [G.REWRITTEN]


def test_hooks_are_removed_after_each_timed_call():
    w = torch.nn.Parameter(torch.ones(4))
    g = G.SpeedGuard(_form(0, 0, [], "rw"), _form(0, 0, [], "plain"), "piece t")
    for _ in range(2 + 2 * G.SAMPLES + 2):
        x, _, ei = _args()
        g(x, w, ei)[0].sum().backward()
    # none left on the parameter, not even the emptied hook dict (torch keeps it registered, and
    # every later backward would call into Python for it)
    assert w._backward_hooks is None
    kept = w.register_hook(lambda g: None)  # a hook of the user's own stays
    x, _, ei = _args()
    g(x, w, ei)[0].sum().backward()
    assert w._backward_hooks is not None and list(w._backward_hooks) == [kept.id]


def test_size_classes_and_grad_mode_are_decided_apart():
    calls = []
    g = G.SpeedGuard(_form(SLOW, 0, calls, "rw"), _form(0, 0, calls, "plain"), "piece t")
    _drive(g, n=100, e=300)
    _drive(g, n=100, e=290)  # same class (within a factor of 4): already decided
    assert len(g.decisions) == 1
    _drive(g, n=5000, e=20000)
    with torch.no_grad():
        _drive(g, n=100, e=300, backward=False, grad=False)
    assert [(d.nodes, d.edges, d.grad) for d in g.decisions] == [(100, 300, True), (5000, 20000, True),
                                                                 (100, 300, False)]


def test_large_pieces_keep_the_rewritten_form_unmeasured():
    calls = []
    g = G.SpeedGuard(_form(SLOW, 0, calls, "rw"), _form(0, 0, calls, "plain"), "piece t")
    ei = torch.zeros(2, 1, dtype=torch.long).expand(2, G.MAX_SIZE)
    with torch.no_grad():
        g(torch.randn(10, 4), torch.ones(4), ei)
    assert calls == ["rw"] and g.decisions[0].kept == G.REWRITTEN
    assert "not measured" in g.decisions[0].reason


def test_edge_features_are_not_counted_as_nodes():
    """A piece's per-edge float inputs (edge features, [E, D]) have as many rows as edges: the
    node count is the other float inputs' rows, so a graph of 10 nodes and E edges with edge
    features is a piece of 10 + E, not 2 E (which would cross MAX_SIZE unmeasured)."""
    E = G.MAX_SIZE // 2 + 10
    ei = torch.zeros(2, 1, dtype=torch.long).expand(2, E)
    x, ea = torch.randn(10, 4), torch.zeros(1, 3).expand(E, 3)
    assert G._sizes((x, ea, ei), *G._size_positions((x, ea, ei))) == (10, E)
    assert G._sizes((ea, ei), *G._size_positions((ea, ei))) == (E, E)  # per-edge floats only
    assert G._sizes((x,), *G._size_positions((x,))) == (10, 0)
    calls = []
    g = G.SpeedGuard(lambda x, ea, ei: calls.append("rw") or (x * 2,), lambda x, ea, ei: calls.append("plain")
                     or (x * 2,), "piece t")
    with torch.no_grad():
        g(x, ea, ei)
    assert g.decisions == [] and calls  # being measured, not decided unmeasured


def _gcn():
    from torch_geometric.nn import GCNConv, global_add_pool

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = GCNConv(8, 16), GCNConv(16, 16)

        def forward(self, x, ei, b):
            return global_add_pool(self.c2(self.c1(x, ei).relu(), ei), b)
    return M()


def _batch(seed, n=300):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    ei = torch.randint(0, n, (2, 3 * n), generator=g)
    b = torch.sort(torch.randint(0, 10, (n,), generator=g))[0]
    return x, ei, b


def test_compiled_model_is_guarded_and_equal_to_eager_throughout():
    torch.manual_seed(0)
    model = _gcn()
    compiled = gnncompile.compile(model, settings={"choices": {"guard": "time"}}, dynamic=True)
    for step in range(2 + 2 * G.SAMPLES + 2):
        x, ei, b = _batch(step)
        out = compiled(x, ei, b)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        ref = model(x, ei, b)
        ref_grads = torch.autograd.grad(ref.square().sum(), list(model.parameters()))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        for a, r in zip(grads, ref_grads):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)
    decisions = compiled.guard_decisions()
    assert len(decisions) == 1 and decisions[0].kept in (G.REWRITTEN, G.UNREWRITTEN)
    assert decisions[0].rewritten_ms > 0 and decisions[0].unrewritten_ms > 0
    text = str(gnncompile.explain(compiled, x, ei, b))
    assert "speed guard" in text and str(decisions[0]) in text


def test_guard_off_returns_the_rewritten_form_unwrapped():
    from gnncompile.compiler.backend import Backend

    seen = {}
    for mode in ("off", "time"):
        be = Backend(Settings.from_config().replace(choices={"guard": mode}, inner="eager"))
        got = seen[mode] = []
        fn = torch.compile(_gcn(), backend=lambda gm, ex, be=be, got=got: got.append(be(gm, ex)) or got[-1])
        fn(*_batch(0))
    assert seen["off"] and not any(isinstance(f, G.SpeedGuard) for f in seen["off"])
    assert any(isinstance(f, G.SpeedGuard) for f in seen["time"])


def test_speed_guard_forms_call_the_generated_code_directly():
    # the forms the speed guard races are the graph modules' generated forwards, not Dynamo's
    # lazily recompiling _lazy_forward, which calls the module (Module.__call__: hooks run) at
    # every call; the guard-off callable is the same forward (Dynamo unwraps it itself)
    from gnncompile.compiler.backend import Backend

    torch._dynamo.reset()  # (this test's compiles do not count toward _gcn's recompile limit)
    for mode in ("time", "off"):
        torch.manual_seed(0)
        model = _gcn()
        be = Backend(Settings.from_config().replace(choices={"guard": mode}, inner="eager"))
        got = []
        fn = torch.compile(model, backend=lambda gm, ex: got.append(be(gm, ex)) or got[-1], dynamic=True)
        fn(*_batch(0))
        forms = [f for g in got for f in (g._forms if isinstance(g, G.SpeedGuard) else (g,))]
        assert forms and all(f.__name__ == "forward" and isinstance(f.__self__, torch.fx.GraphModule)
                             for f in forms), forms
        through_module = []
        for f in forms:
            f.__self__.register_forward_pre_hook(lambda *_: through_module.append(1))
        for step in range(2 + 2 * G.SAMPLES + 2):  # the guard's race calls both forms
            x, ei, b = _batch(step)
            torch.testing.assert_close(fn(x, ei, b), model(x, ei, b), rtol=1e-5, atol=1e-5)
        assert through_module == []
    torch._dynamo.reset()


def test_a_compiled_call_without_hooks_skips_the_module_call(monkeypatch):
    # gnncompile.compile's module, no hooks: a call goes to the model guard (or the compiled
    # model) without Module.__call__ and forward; with a hook, or while exporting, the usual way
    from gnncompile.compiler.api import CompiledModule

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _gcn()
    for guard in ("time", "off"):
        compiled = gnncompile.compile(model, settings={"choices": {"guard": guard}}, dynamic=True)
        wrapper_calls = []
        forward = CompiledModule.forward
        monkeypatch.setattr(CompiledModule, "forward",
                            lambda self, *a, **k: wrapper_calls.append(1) or forward(self, *a, **k))
        out = compiled(*_batch(0))
        torch.testing.assert_close(out, model(*_batch(0)), rtol=1e-5, atol=1e-5)
        assert wrapper_calls == []
        hook = compiled.register_forward_hook(lambda m, a, o: o * 2)  # (the races alternate forms)
        torch.testing.assert_close(compiled(*_batch(0)), 2 * out, rtol=1e-5, atol=1e-5)
        assert wrapper_calls == [1]
        hook.remove()
        monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
        with pytest.raises(RuntimeError, match="torch.export of a module returned by gnncompile.compile"):
            compiled(*_batch(0))
        monkeypatch.undo()
    torch._dynamo.reset()


def test_explain_of_an_uncompiled_model_has_no_guard_section():
    rep = gnncompile.explain(_gcn(), *_batch(0))
    assert rep.guard is None and "speed guard" not in str(rep)


def test_guard_setting_is_checked(monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_GUARD", "sometimes")
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_GUARD"):
        config.current()
    monkeypatch.setenv("GNNCOMPILE_GUARD", "off")
    assert Settings.from_config().guard == "off"
    monkeypatch.delenv("GNNCOMPILE_GUARD")
    assert Settings.from_config().guard == "time"
    with pytest.raises(ValueError, match="guard"):
        Settings(choices=(("guard", "maybe"),))
    with pytest.raises(ValueError, match="unknown choice"):
        Settings(choices=(("gaurd", "off"),))


def test_model_runs_as_written_once_the_whole_call_was_slower(monkeypatch):
    # the whole compiled call made 20 ms slower (as Dynamo's own cost could make it): the model
    # guard, timing it against the model as written, keeps the model
    torch.manual_seed(0)
    model = _gcn()
    compiled = gnncompile.compile(model, settings={"choices": {"guard": "time"}}, dynamic=True)
    through = []
    inner = compiled._compiled

    def slow(*a, **k):
        through.append(1)
        time.sleep(SLOW)
        return inner(*a, **k)
    object.__setattr__(compiled, "_compiled", slow)
    steps = G.WARM + 2 + 2 * G.SAMPLES + 4
    for step in range(steps):
        x, ei, b = _batch(step)
        out = compiled(x, ei, b)
        torch.testing.assert_close(out, model(x, ei, b), rtol=1e-5, atol=1e-5)
        out.sum().backward()
    kept = [(d.piece.split(" ")[0], d.kept) for d in compiled.guard_decisions()]
    assert kept[0][0] == "piece" and kept[-1] == ("the", G.EAGER), kept
    n = len(through)
    compiled(*_batch(0)).sum().backward()
    assert len(through) == n  # the model itself, without Dynamo
    # ... called directly: not through the compiled module's forward and guard (their per-call
    # work made a training step measurably slower than eager's), and no timing hook is left on
    # the parameters (an emptied hook dict costs every backward a call into Python)
    assert all(p._backward_hooks is None for p in model.parameters())
    from gnncompile.compiler.api import CompiledModule
    wrapper_calls, model_calls = [], []
    forward = CompiledModule.forward
    monkeypatch.setattr(CompiledModule, "forward", lambda self, *a, **k: wrapper_calls.append(1) or forward(self, *a, **k))
    model.register_forward_hook(lambda *_: model_calls.append(1))
    out = compiled(*_batch(1))
    torch.testing.assert_close(out, model(*_batch(1)), rtol=0, atol=0)
    assert wrapper_calls == [] and len(model_calls) == 2
    hook = compiled.register_forward_hook(lambda m, a, o: o * 2)  # a hook on the wrapper: the usual way
    torch.testing.assert_close(compiled(*_batch(1)), 2 * out, rtol=0, atol=0)
    assert wrapper_calls == [1] and len(through) == n
    hook.remove()
    with torch.no_grad():  # no-grad calls are measured apart: still compiled (through the model
        compiled(*_batch(0))  # guard, called without the Module call and forward: no hooks)
    assert len(through) == n + 1 and wrapper_calls == [1]
    assert "the whole model" in str(gnncompile.explain(compiled, *_batch(0)))


def test_model_guard_keeps_the_compiled_model_when_it_is_faster():
    calls = []
    model = torch.nn.Linear(4, 4)

    def eager(x):
        calls.append("eager")
        time.sleep(SLOW)
        return model(x)

    def compiled(x):
        calls.append("compiled")
        return model(x)
    verdicts = []
    g = G.ModelGuard(compiled, model, lambda grad: verdicts.append(grad) or None)
    object.__setattr__(g, "_forms", (compiled, eager))
    for _ in range(G.WARM + 2 + 2 * G.SAMPLES + 3):
        g(torch.randn(3, 4)).sum().backward()
    assert calls[:G.WARM] == ["compiled"] * G.WARM  # no verdict from the pieces: WARM calls first
    assert [d.kept for d in g.decisions] == [G.COMPILED]
    assert calls[-3:] == ["compiled"] * 3
    assert g.decisions[0].unrewritten_ms > g.decisions[0].rewritten_ms + 10


def test_a_compile_failure_falls_back_to_the_model_with_one_warning(monkeypatch):
    from gnncompile.compiler import CompileFallbackWarning
    from gnncompile.compiler.backend import Backend

    def broken(self, gm, example_inputs):
        raise IndexError("tuple index out of range")  # as torch's own failure on GraphUNet
    monkeypatch.setattr(Backend, "__call__", broken)
    torch._dynamo.reset()  # no compiled code of an earlier test for the same forward
    torch.manual_seed(0)
    model = _gcn()
    compiled = gnncompile.compile(model)
    x, ei, b = _batch(0)
    with pytest.warns(CompileFallbackWarning, match="IndexError: tuple index out of range"):
        out = compiled(x, ei, b)
    torch.testing.assert_close(out, model(x, ei, b))
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("error")  # once only
        torch.testing.assert_close(compiled(*_batch(1)), model(*_batch(1)))
    # the user's own errors are raised as eager raises them
    with pytest.raises(RuntimeError) as err:
        compiled(torch.randn(300, 5), ei, b)
    assert "CompileFallback" not in str(err.value)


def test_bad_input_raises_the_models_own_error_and_compiling_goes_on():
    torch.manual_seed(0)
    model = _gcn()
    compiled = gnncompile.compile(model)
    x, ei, b = _batch(0)
    with pytest.raises(RuntimeError) as err:
        compiled(torch.randn(300, 5), ei, b)  # 5 features where the layer takes 8
    with pytest.raises(RuntimeError) as eager_err:
        model(torch.randn(300, 5), ei, b)
    assert str(err.value) == str(eager_err.value) and err.value.__cause__ is None
    assert compiled._failed is None  # not a compile failure: still compiled
    torch.testing.assert_close(compiled(x, ei, b), model(x, ei, b), rtol=1e-5, atol=1e-5)


def test_fullgraph_compile_errors_are_raised():
    class Breaks(torch.nn.Module):
        def forward(self, x):
            torch._dynamo.graph_break()
            return x * 2
    compiled = gnncompile.compile(Breaks(), fullgraph=True)
    with pytest.raises(Exception, match="graph_break|graph break"):
        compiled(torch.randn(3))


# ----------------------------------------------------------------------------- re-check of a close win
class _Clock:
    """Stands in for the guard's clock: time moves only where a fake form says it costs."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(G, "time", c)  # the guard's own clock only
    return c


def _costed_guard(clock, eager_ms, model=None, g=None, compiled_ms=lambda g: 1.0):
    """A ModelGuard (``g``, or a new one) whose compiled form costs ``compiled_ms(guard)`` ms a
    call (1 ms by default) and whose model as written costs ``eager_ms(guard)`` ms (on the fake
    clock); both really run ``model``. Returns the guard, the list of (grad mode, form) of each
    call and the model."""
    model = model or torch.nn.Linear(4, 4)
    calls = []

    def compiled(x):
        calls.append((torch.is_grad_enabled(), G.COMPILED))
        clock.t += compiled_ms(g) * 1e-3
        return model(x)

    def eager(x):
        calls.append((torch.is_grad_enabled(), G.EAGER))
        clock.t += eager_ms(g) * 1e-3
        return model(x)
    g = g or G.ModelGuard(compiled, model, lambda grad: "rewritten")
    g._forms = (compiled, eager)
    return g, calls, model


def _call(g, model, grad=True):
    x = torch.randn(3, 4)
    if grad:
        out = g(x)
        torch.testing.assert_close(out, model(x), rtol=0, atol=0)  # the form's own output
        out.sum().backward()
    else:
        with torch.no_grad():
            torch.testing.assert_close(g(x), model(x), rtol=0, atol=0)


def test_a_close_win_that_is_a_loss_in_the_steady_state_switches_to_eager(clock):
    # eager 5% slower during the first race (a transient), 5% faster from then on
    g, calls, model = _costed_guard(clock, lambda g: 1.05 if not g.decisions else 0.95)
    while not g.decisions:
        _call(g, model)
    first = g.decisions[0]
    assert first.kept == G.COMPILED and not first.recheck and "close win" in first.reason
    assert not g.settled(True)
    start = len(calls)
    for i in range(G.RECHECK_AFTER + 1 + 2 * G.RECHECK_SAMPLES + 1):
        _call(g, model)
        if i % 10 == 0:  # no-grad calls race apart and do not count towards the re-check
            _call(g, model, grad=False)
    training = [f for grad, f in calls[start:] if grad]
    # RECHECK_AFTER calls of the compiled model, then one untimed eager call, then both alternately
    assert training[:G.RECHECK_AFTER] == [G.COMPILED] * G.RECHECK_AFTER
    assert training[G.RECHECK_AFTER] == G.EAGER
    trained = [d for d in g.decisions if d.grad]
    assert [(d.kept, d.recheck) for d in trained] == [(G.COMPILED, False), (G.EAGER, True)]
    again = trained[1]
    assert again.rewritten_ms == pytest.approx(1.0) and again.unrewritten_ms == pytest.approx(0.95)
    assert f"median of {G.RECHECK_SAMPLES} paired calls" in again.reason and "fastest" in again.reason
    assert g.settled(True) and g.as_written[True] is g._forms[1]
    assert training[-1] == G.EAGER  # the call after the re-check: eager
    assert all(p._backward_hooks is None for p in model.parameters())  # no timing hook left


def test_a_close_win_confirmed_at_the_re_check_stays_compiled(clock):
    g, calls, model = _costed_guard(clock, lambda g: 1.05)
    for _ in range(G.WARM + 2 + 2 * G.SAMPLES + G.RECHECK_AFTER + 2 + 2 * G.RECHECK_SAMPLES + 5):
        _call(g, model)
    assert [(d.kept, d.recheck) for d in g.decisions] == [(G.COMPILED, False), (G.COMPILED, True)]
    assert g.settled(True) and True not in g.as_written
    assert [f for _, f in calls[-5:]] == [G.COMPILED] * 5
    assert calls.count((True, G.EAGER)) == 1 + G.SAMPLES + 1 + G.RECHECK_SAMPLES  # one re-check only


def test_a_clear_win_is_not_re_checked(clock):
    g, calls, model = _costed_guard(clock, lambda g: 1 + G.RECHECK_BELOW + 0.01)
    while not g.decisions:
        _call(g, model)
    assert g.settled(True)  # nothing left to time: a benchmark may time it from here
    start = len(calls)
    for _ in range(G.RECHECK_AFTER + 2 + 2 * G.RECHECK_SAMPLES + 5):
        _call(g, model)
    assert [(d.kept, d.recheck) for d in g.decisions] == [(G.COMPILED, False)]
    assert "close win" not in g.decisions[0].reason
    assert [f for _, f in calls[start:]] == [G.COMPILED] * (len(calls) - start)


def test_explain_reports_the_re_check(clock):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    compiled = gnncompile.compile(model, settings={"choices": {"guard": "time"}})
    # the compiled module's own guard, with fake forms around the real model (no Dynamo compile: fast)
    g, calls, _ = _costed_guard(clock, lambda g: 1.05 if not g.decisions else 0.9, model, compiled._guard)
    for _ in range(G.WARM + 2 + 2 * G.SAMPLES + G.RECHECK_AFTER + 2 + 2 * G.RECHECK_SAMPLES + 2):
        compiled(torch.randn(3, 4)).sum().backward()
    text = str(gnncompile.explain(compiled, torch.randn(3, 4)))
    first, again = g.decisions
    assert str(first) in text and str(again) in text
    assert "re-check of a close win" in str(again) and "kept eager" in str(again)
    assert f"timed again after {G.RECHECK_AFTER} calls" in str(again)
    assert "1.000 ms compiled vs 0.900 ms eager" in str(again)
    n = len(calls)
    compiled(torch.randn(3, 4))
    assert calls[n:] == [(True, G.EAGER)] and compiled._as_written[True] is g._forms[1]  # eager from then on


def test_benchmarks_step_past_the_re_check(clock):
    """benchmarks/_common.step_past_guard (the benchmarks' warm-up) goes on past a pending
    re-check, so that they time the form kept for good."""
    from types import SimpleNamespace

    from benchmarks import _common

    g, calls, model = _costed_guard(clock, lambda g: 1.05 if not g.decisions else 0.95)
    run = SimpleNamespace(_guard=g, gnncompile_settings=SimpleNamespace(guard="time"),
                          guard_decisions=lambda: g.decisions)
    n = _common.step_past_guard(run, lambda: _call(g, model))
    assert g.settled(True) and [d.kept for d in g.decisions] == [G.COMPILED, G.EAGER]
    # 2 compiled calls (the pieces have decided), one untimed eager call, the timed calls, the
    # deciding call; the re-check likewise
    first = 2 + 1 + 2 * G.SAMPLES + 1
    assert n == len(calls) == first + G.RECHECK_AFTER + 1 + 2 * G.RECHECK_SAMPLES + 1
    assert n <= _common.guard_steps()


# ----------------------------------------------------------------------------- the model race's rule
def _costs(*ms):
    """A cost per call (ms) that cycles through ``ms``, one step per call of that form."""
    n = [0]

    def cost(_g):
        n[0] += 1
        return ms[(n[0] - 1) % len(ms)]
    return cost


def _first_decision(g, model):
    while not g.decisions:
        _call(g, model)
    return g.decisions[0]


def test_the_model_race_keeps_the_form_faster_in_most_pairs_though_not_in_its_fastest_call(clock):
    # GINConv's case in the zoo (zoo_zen4_s53): both forms' fastest calls equal, the compiled model
    # faster in the typical call (eager's own cost varies: allocations). The fastest-call rule
    # kept eager (a tie is eager's); the paired calls keep the compiled model
    g, calls, model = _costed_guard(clock, _costs(0.95, 0.7, 0.95, 0.95, 0.95, 0.95), compiled_ms=lambda g: 0.7)
    d = _first_decision(g, model)
    assert d.kept == G.COMPILED, d
    assert f"median of {G.SAMPLES} paired calls: eager / compiled 1.36x" in d.reason
    assert d.rewritten_ms == pytest.approx(0.7) and d.unrewritten_ms == pytest.approx(0.95)  # the medians
    assert "fastest 0.700 ms compiled vs 0.700 ms eager" in d.reason


def test_the_model_race_is_not_won_by_one_fast_call(clock):
    # the compiled model once fast (0.5 ms), usually 1.0 ms; eager always 0.95 ms: eager is kept
    # (the fastest-call rule kept the compiled model: 0.5 against 0.95)
    g, calls, model = _costed_guard(clock, lambda g: 0.95, compiled_ms=_costs(1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0))
    d = _first_decision(g, model)
    assert d.kept == G.EAGER and "eager / compiled 0.95x" in d.reason, d
    assert g.as_written[True] is g._forms[1]


@pytest.mark.parametrize("faster", [G.COMPILED, G.EAGER])
def test_the_model_race_keeps_whichever_form_is_made_faster(clock, faster):
    # the same noisy costs for both forms (calls slowed at random, as by other tenants), one form
    # 8% cheaper underneath: that one is kept, over 20 races with different noise
    import random

    kept = []
    for seed in range(20):
        rng = random.Random(seed)

        def cost(form):
            base = 0.92 if form == faster else 1.0
            return lambda g: base * (1 + (rng.expovariate(1 / 0.05) if rng.random() < 0.3 else 0.0))
        g, calls, model = _costed_guard(clock, cost(G.EAGER), compiled_ms=cost(G.COMPILED))
        kept.append(_first_decision(g, model).kept)
    assert kept == [faster] * 20, kept


def test_pieces_still_decide_by_the_fastest_call():
    assert G.SpeedGuard._rule == "fastest" and G.ModelGuard._rule == "paired"


def test_a_win_of_1_5x_in_the_first_pairs_is_re_checked(clock):
    # GMMConv in the zoo (nothing rewritten): its first 5 pairs read 1.22x, its steady state 0.97x.
    # A win under 2x is timed again, and the steady state's loss switches to eager
    g, calls, model = _costed_guard(clock, lambda g: 1.5 if not g.decisions else 0.97)
    for _ in range(G.WARM + 2 + 2 * G.SAMPLES + G.RECHECK_AFTER + 2 + 2 * G.RECHECK_SAMPLES + 2):
        _call(g, model)
    assert [(d.kept, d.recheck) for d in g.decisions] == [(G.COMPILED, False), (G.EAGER, True)]
    assert "a close win (under 2.00x)" in g.decisions[0].reason
