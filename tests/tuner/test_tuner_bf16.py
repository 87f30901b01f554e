"""bf16 in the tuner's search space only where the user allows lower precision (tune
--allow-bf16, Workload.allow_bf16): the precision is suggested then and only then, the trial's
compiled model carries it, the workload's signature (so the study and its profile) says so."""
from __future__ import annotations

import pytest
import torch

optuna = pytest.importorskip("optuna")

import gnncompile  # noqa: E402
from gnncompile.cli import tune as tune_cli  # noqa: E402
from gnncompile.tuner import study as study_mod  # noqa: E402
from gnncompile.tuner import workloads as wl_mod  # noqa: E402
from gnncompile.tuner.workloads import Workload  # noqa: E402

FIXED = {"pool_size": 2, "num_workers": 0, "threads": 1, "chunks_per_thread": 4, "prefetch_distance": 8,
         "block_budget_kib": 0,
         "inner": "eager", "spmm_impl": "native"}


def _w(**kw):
    return Workload(kind="graphs", model="gcn", hidden=8, layers=2, num_graphs=20, min_nodes=3, max_nodes=6,
                    compiled=True, **kw)


def test_precision_is_searched_only_when_allowed():
    props = gnncompile.hardware.detect("cpu")
    s = study_mod.suggest(optuna.trial.FixedTrial(FIXED), _w(), props, 64, None, 2)
    assert s["precision"] is None  # not suggested: a FixedTrial without it would refuse the suggestion
    with pytest.raises(ValueError):
        study_mod.suggest(optuna.trial.FixedTrial(FIXED), _w(allow_bf16=True), props, 64, None, 2)
    s = study_mod.suggest(optuna.trial.FixedTrial({**FIXED, "precision": "bf16"}), _w(allow_bf16=True), props,
                          64, None, 2)
    assert s["precision"] == "bf16"
    model = wl_mod._compile_with(torch.nn.Linear(2, 2), s, torch.device("cpu"))
    assert model.gnncompile_settings.precision == "bf16"
    fp32 = wl_mod._compile_with(torch.nn.Linear(2, 2), dict(s, precision="fp32"), torch.device("cpu"))
    assert fp32.gnncompile_settings.precision == "fp32"
    # on CUDA the precision is never searched (bf16 gathering is CPU-only)
    cuda = {"type": "cuda", "host_logical_cpus": 8, "capability": [9, 0]}
    t = optuna.trial.FixedTrial({"pool_size": 2, "num_workers": 0, "pin_memory": False, "lanes_per_row": 8, "rows_per_block": 4,
                                 "items_per_group": 256, "inner": "eager"})
    assert study_mod.suggest(t, _w(allow_bf16=True), cuda, 64, None, 2)["precision"] is None


def test_the_signature_and_the_defaults():
    assert "allow_bf16" not in _w().signature_dict()  # as before: earlier studies keep their names
    assert _w(allow_bf16=True).signature_dict()["allow_bf16"] is True
    assert wl_mod.default_settings(_w(allow_bf16=True))["precision"] is None  # the baseline is fp32
    with pytest.raises(ValueError, match="allow_bf16 needs a compiled workload"):
        Workload(compiled=False, allow_bf16=True)
    with pytest.raises(ValueError, match="allow_bf16 must be True or False"):
        Workload(allow_bf16="yes")


def test_the_command_line_flag():
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    tune_cli.add_parser(sub)
    args = p.parse_args(["tune", "--workload", "graphs", "--allow-bf16"])
    assert tune_cli._workload(Workload, args).allow_bf16 is True
    args = p.parse_args(["tune", "--workload", "graphs"])
    assert tune_cli._workload(Workload, args).allow_bf16 is False


def test_profile_states_its_precision_and_the_opt_in():
    rule = study_mod.precision_rule({"precision": "bf16"}, {"kind": "fullgraph", "allow_bf16": True})
    assert rule["precision"] == "bf16" and rule["bf16_searched"] and rule["opt_in"] is True
    assert "GNNCOMPILE_PRECISION=bf16" in rule["applied_only_with"] and "2^-8" in rule["computes"]
    # fp32 chosen (or nothing searched): no opt-in needed, and it says whether bf16 was searched
    assert study_mod.precision_rule({"precision": None}, {"allow_bf16": True}) == {"precision": "fp32",
                                                                                   "bf16_searched": True}
    assert study_mod.precision_rule({"precision": "fp32"}, {}) == {"precision": "fp32", "bf16_searched": False}


def test_prefetch_choices_hold_the_kernels_rule_and_old_studies_resume():
    props = gnncompile.hardware.detect("cpu")
    # 0: the kernels' own distance by row width (32 edges for 64-wide rows), a choice of new studies
    assert 0 in study_mod.PREFETCH_CHOICES and set(study_mod.LEGACY_PREFETCH_CHOICES) < set(study_mod.PREFETCH_CHOICES)
    s = study_mod.suggest(optuna.trial.FixedTrial({**FIXED, "prefetch_distance": 0}), _w(), props, 64, None, 2)
    assert s["knobs"] == [4, 0, 0]
    study = optuna.create_study(direction="maximize")
    t = study.ask()
    study_mod.suggest(t, _w(), props, 64, None, 2)
    assert list(t.distributions["prefetch_distance"].choices) == study_mod.PREFETCH_CHOICES
    # a study begun with the earlier choices keeps them (another set would be refused by Optuna)
    old = optuna.create_study(direction="maximize")
    old.add_trial(optuna.trial.create_trial(
        params={"prefetch_distance": 8}, value=1.0,
        distributions={"prefetch_distance": optuna.distributions.CategoricalDistribution(
            study_mod.LEGACY_PREFETCH_CHOICES)}))
    t = old.ask()
    study_mod.suggest(t, _w(), props, 64, None, 2)
    assert list(t.distributions["prefetch_distance"].choices) == study_mod.LEGACY_PREFETCH_CHOICES
    old.tell(t, 1.0)  # accepted: the same distribution as the study's first trial
    with pytest.raises(ValueError):  # what the legacy choices avoid
        old.ask({"prefetch_distance": optuna.distributions.CategoricalDistribution(study_mod.PREFETCH_CHOICES)})
