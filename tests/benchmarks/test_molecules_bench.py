"""benchmarks/molecules.py: the eager-allocator variant (the model as written under what compile()
turns on process-wide for a CPU model: huge pages and the block cache) is the model itself, with
the allocator settings applied; it is a known variant. Speed is not asserted."""
from __future__ import annotations

from benchmarks import molecules as M
from gnncompile.hardware import memory


def test_eager_allocator_is_the_model_with_the_allocator_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "apply", lambda choice, devices: calls.append(("huge_pages", choice, devices)) or "x")
    monkeypatch.setattr(memory, "apply_cache", lambda choice, devices: calls.append(("cache", choice, devices)) or "y")
    model = M.build_model("gin")
    assert M.wrap(model, "eager-allocator") is model
    assert calls == [("huge_pages", "auto", {"cpu"}), ("cache", "auto", {"cpu"})]
    calls.clear()
    assert M.wrap(model, "eager") is model and calls == []
    assert "eager-allocator" in M.ALLOCATOR_VARIANTS
