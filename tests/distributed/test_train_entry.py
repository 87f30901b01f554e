"""``python -m gnncompile.train`` in one process (in this process): a run stopped after an epoch
and resumed from its checkpoint ends with the parameters of a run that was never stopped; a
checkpoint of another configuration is refused; a failed save leaves the previous checkpoint
whole; bad arguments are clear errors. (Its torchrun form, 2 ranks with a resume, is run by
tests/package/test_readme_examples.py from docs/guides/ddp.md; DDP parity by
test_ddp_compiled.py.)"""
from __future__ import annotations

import json

import pytest
import torch

from gnncompile import train

SMALL = ["--nodes", "1500", "--degree", "6", "--features", "16", "--hidden", "32", "--batch-size", "128",
         "--fanout", "5,3", "--quiet", "--threads", "1"]


def _run(*extra):
    torch._dynamo.reset()
    return train.run(train.parser().parse_args(SMALL + list(extra)))


@pytest.mark.parametrize("form", ["--eager", "--order=ddp-compile"])
def test_resume_ends_where_an_uninterrupted_run_does(tmp_path, form):
    straight = _run(form, "--epochs", "3")
    ck = tmp_path / "run.pt"
    first = _run(form, "--epochs", "1", "--checkpoint", str(ck))
    assert ck.exists() and first["steps"] == straight["epochs"][0]["steps"]
    resumed = _run(form, "--epochs", "3", "--checkpoint", str(ck), "--resume", "--json", str(tmp_path / "r.json"))
    assert [e["epoch"] for e in resumed["epochs"]] == [1, 2]
    assert resumed["steps"] == straight["steps"]
    # the same batches and optimizer state: the same losses and parameters, to the bit in eager
    # mode; compiled, the fused kernels run in the same order in both runs too
    assert [e["loss"] for e in resumed["epochs"]] == [e["loss"] for e in straight["epochs"][1:]]
    assert resumed["param_checksum"] == straight["param_checksum"]
    assert straight["epochs"][-1]["loss"] < straight["epochs"][0]["loss"]  # it learns
    assert json.loads((tmp_path / "r.json").read_text())["param_checksum"] == resumed["param_checksum"]
    # a run that did not resume is different (the check above can fail)
    assert _run(form, "--epochs", "2")["param_checksum"] != straight["param_checksum"]


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    ck = tmp_path / "run.pt"
    _run("--eager", "--epochs", "1", "--checkpoint", str(ck))
    with pytest.raises(train.TrainError, match=r"another model or graph \(--hidden 32 in the checkpoint, 64 now\)"):
        train.run(train.parser().parse_args(SMALL + ["--eager", "--epochs", "2", "--checkpoint", str(ck),
                                                     "--resume", "--hidden", "64"]))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(train.TrainError, match="cannot read the checkpoint"):
        _run("--eager", "--epochs", "2", "--checkpoint", str(bad), "--resume")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(train.TrainError, match="not a checkpoint of python -m gnncompile.train"):
        _run("--eager", "--epochs", "2", "--checkpoint", str(tmp_path / "other.pt"), "--resume")


def test_a_failed_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    ck = tmp_path / "run.pt"
    _run("--eager", "--epochs", "1", "--checkpoint", str(ck))
    before = ck.read_bytes()
    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        _run("--eager", "--epochs", "2", "--checkpoint", str(ck), "--resume")
    assert ck.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]  # no temporary file left


@pytest.mark.parametrize("args, match", [
    (["--fanout", "5,0"], "--fanout"),
    (["--fanout", "x"], "--fanout"),
    (["--resume"], "--resume needs --checkpoint"),
    (["--batch-size", "0"], "--batch-size"),
    (["--data", "cora", "--root", "/nonexistent"], "raw Cora files are not in"),
    (["--backend", "nccl", "--device", "cpu"], "nccl needs CUDA"),
])
def test_bad_arguments_are_clear_errors(args, match, capsys):
    assert train.main(SMALL + ["--eager"] + args) == 2
    assert match in capsys.readouterr().err


def test_the_command_line_has_it():
    from gnncompile.cli import parser

    args = parser().parse_args(["train", "--epochs", "2", "--order", "compile-ddp"])
    assert (args.cmd, args.epochs, args.order) == ("train", 2, "compile-ddp")
