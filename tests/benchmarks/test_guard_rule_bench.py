"""benchmarks.guard_rule's scoring: each rule's pick per window, and wrong picks / regret against the
long run's medians (no model is run here)."""
from __future__ import annotations

import pytest

from benchmarks import guard_rule


def test_each_rule_reads_the_window_its_own_way():
    # eager's fastest call ties the compiled one's, its typical call is slower
    compiled, eager = [1.0] * 5, [1.0, 1.5, 1.5, 1.5, 1.5]
    assert guard_rule.pick("min", compiled, eager) == "eager"  # a tie is eager's
    assert guard_rule.pick("median", compiled, eager) == "compiled"
    assert guard_rule.pick("paired", compiled, eager) == "compiled"
    # one lucky compiled call
    compiled, eager = [1.0, 1.0, 0.5, 1.0, 1.0], [0.95] * 5
    assert guard_rule.pick("min", compiled, eager) == "compiled"
    assert guard_rule.pick("paired", compiled, eager) == "eager"
    # the margin: 2% faster is not enough
    assert guard_rule.pick("paired", [1.0] * 5, [1.02] * 5) == "eager"
    assert guard_rule.pick("paired", [1.0] * 5, [1.04] * 5) == "compiled"
    with pytest.raises(ValueError):
        guard_rule.pick("mean", [1.0], [1.0])


def test_score_counts_wrong_picks_against_the_long_run():
    # the compiled form 20% faster in the long run, but in the first window of 5 eager's fastest
    # call is a lucky one: the min rule picks eager there (wrong, regret 0.2), the paired rule not
    compiled = [1.0] * 20
    eager = [0.9] + [1.2] * 19
    s = guard_rule.score({"compiled": compiled, "eager": eager, "kept": eager})
    assert s["long_ratio"] == pytest.approx(1.2)
    m5, p5 = s["rules"]["min/5"], s["rules"]["paired/5"]
    assert (m5["windows"], m5["compiled"], m5["wrong"]) == (4, 3, 1)
    assert m5["regret"] == pytest.approx(0.2 / 4)
    assert (p5["windows"], p5["compiled"], p5["wrong"], p5["regret"]) == (4, 4, 0, 0.0)
    assert s["rules"]["paired/10"]["windows"] == 2
