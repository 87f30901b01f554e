"""Fixtures of the codegen tests: a cache folder per test module, and generated kernels on in it."""
from __future__ import annotations

import pytest

from gnncompile import codegen, config


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("codegen-cache")


@pytest.fixture
def gen(cache):
    """Generated kernels on, in the module's cache folder; the registry emptied afterwards."""
    codegen.reset()
    with config.override(codegen="auto", cache_dir=cache):
        yield cache
    codegen.reset()
