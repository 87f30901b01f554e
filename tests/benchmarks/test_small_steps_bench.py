"""benchmarks/small_steps.py: the ``@KIB`` suffix of a molecules variant (the block cache's minimum
block size set before each of the variant's steps, for an A/B of that setting in one process)."""
from __future__ import annotations

import pytest

from benchmarks import small_steps
from gnncompile.hardware import memory


def test_the_suffix_is_split_off_and_checked():
    assert small_steps._cache_min("gnc:auto+guard@2048") == ("gnc:auto+guard", 2048)
    assert small_steps._cache_min("eager@256") == ("eager", 256)
    assert small_steps._cache_min("eager") == ("eager", 0)
    for bad in ("eager@", "eager@2k", "eager@2"):
        with pytest.raises(SystemExit, match="@KIB"):
            small_steps._cache_min(bad)


def test_the_minimum_is_set_in_bytes_keeping_the_cap(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "status", lambda: {"cache_cap": 64 << 20})
    monkeypatch.setattr(memory, "enable_cache", lambda cap, min_bytes: calls.append((cap, min_bytes)) or True)
    small_steps._set_cache_min(2048)
    monkeypatch.setattr(memory, "status", lambda: {"cache_cap": 0})  # off: the default cap
    small_steps._set_cache_min(256)
    assert calls == [(64 << 20, 2 << 20), (memory.default_cache_cap(), 256 << 10)]
