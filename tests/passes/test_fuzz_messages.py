"""Differential fuzzing of the compiler against eager (gnncompile/testing/fuzz.py): random user
MessagePassing layers (elementwise messages over x_i, x_j, edge features, edge weights and
parameters; modelled and unmodelled operations, every argument form, in-place writes, rounding
and integer operations; NaN, infinities and signed zeros in the inputs; ties), 10 per case,
compiled == eager in float64, forward and backward. A fixed set of seeds, 150 layers (they
hold every form test_the_generator_covers_what_it_promises asks for);
`python -m benchmarks fuzz_messages` runs as many as a time budget allows."""
from __future__ import annotations

import pytest

from gnncompile.testing import fuzz
from shared import _fresh_dynamo  # noqa: F401  (autouse)

SEEDS = range(15)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_layers_compute_what_eager_computes(seed):
    case = fuzz.random_case(seed, layers=10)
    res, bad = fuzz.check(case)
    sources = "\n".join(f"layer {i} (aggr {case.layers[i][1]}):\n{case.layers[i][0]}" for i in bad)
    assert res.ok, f"{res.detail}\n{sources}"


def test_the_generator_covers_what_it_promises():
    """Over the fixed seeds the layers hold in-place writes, unmodelled and parametrised
    operations, every aggregation, and cases with special values."""
    ops, aggrs, special = set(), set(), 0
    for seed in SEEDS:
        case = fuzz.random_case(seed, layers=10)
        special += case.special
        for src, aggr in case.layers:
            aggrs.add(aggr)
            ops.update(tok for tok in ("add_(", "relu_(", "inplace=True", "+=", "rounding_mode", "alpha=",
                                       "approximate", "torch.floor", "//", "torch.where", "**", "torch.pow")
                       if tok in src)
    assert aggrs == set(fuzz.AGGRS)
    assert special >= 5
    assert {"add_(", "inplace=True", "rounding_mode", "alpha=", "torch.floor", "**"} <= ops, ops
