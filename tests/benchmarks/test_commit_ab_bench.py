"""The commit A/B benchmark (benchmarks/commit_ab.py): revisions, arguments, the interleaving,
the summary and its verdicts, the report, and the child's refusal to time the wrong tree."""
from __future__ import annotations

import argparse
import json
import sys

import pytest

from benchmarks import _common, commit_ab


def _opts(**kw):
    base = dict(nodes=200, features=8, threads=1, warmup=0, repeats=1, timeout=300)
    base.update(kw)
    return argparse.Namespace(**base)


def test_a_bad_revision_is_a_clear_error(capsys):
    with pytest.raises(commit_ab.CommitABError, match="names no commit"):
        commit_ab.resolve("no-such-revision-0123")
    with pytest.raises(commit_ab.CommitABError, match="not a revision"):
        commit_ab.resolve("--all")
    assert commit_ab.main(["--base", "no-such-revision-0123", "--prepare-only"]) == 2
    assert "names no commit" in capsys.readouterr().err
    head = commit_ab.resolve("HEAD")
    assert len(head) == 40 and commit_ab.resolve(head[:10]) == head


@pytest.mark.parametrize("argv", [["--models", "GAT"], ["--models", ""], ["--rounds", "0"],
                                  ["--peers", "eager", "--models", "GIN"], ["--peers", "pyg"],
                                  ["--peer-targets", "eager"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        commit_ab.main(argv + ["--prepare-only"])
    assert e.value.code == 2


def test_rounds_alternate_the_order_per_round_and_per_model():
    seen = []
    runs = commit_ab.run_rounds(["GCN", "GIN"], 2, lambda side, model, r: seen.append((r, model, side)) or {},
                                peers=["eager"], peer_model="GCN", log=lambda s: None)
    assert seen == [(0, "GCN", "base"), (0, "GCN", "head"), (0, "GIN", "head"), (0, "GIN", "base"), (0, "GCN", "eager"),
                    (1, "GCN", "head"), (1, "GCN", "base"), (1, "GIN", "base"), (1, "GIN", "head"), (1, "GCN", "eager")]
    assert [r["side"] for r in runs] == [s for _, _, s in seen]


def _run(r, model, side, ms, loss=1.5, graph="g0"):
    return {"round": r, "model": model, "side": side, "order": "", "median_s": ms / 1e3, "first_loss": loss,
            "graph": graph, "rel_err": 1e-6, "guard": []}


def test_summary_pairs_rounds_and_reads_the_interval():
    runs = []
    for r, (b, h, e) in enumerate([(200, 100, 700), (210, 100, 690), (190, 101, 710)]):
        runs += [_run(r, "GCN", "base", b), _run(r, "GCN", "head", h), _run(r, "GCN", "eager", e, loss=None)]
    runs.append({"round": 3, "model": "GCN", "side": "base", "order": "", "error": "rc 1: boom"})  # no pair
    s = commit_ab.summarise(runs, ["GCN"], 1.3, 1e-4, ["eager"], "GCN", {"eager": 6.0})
    m = s["models"]["GCN"]
    assert m["pairs"] == 3 and m["base_median_ms"] == 200 and m["head_median_ms"] == 100
    assert 1.9 < m["speedup"]["ratio"] < 2.05 and m["speedup"]["low"] > 1.3
    assert m["verdict"].startswith("met") and m["losses_agree"] and s["agree"]
    q = s["peers"]["eager"]
    assert q["pairs"] == 3 and 6.8 < q["head_over_peer"]["ratio"] < 7.1 and q["verdict"].startswith("met")
    assert s["errors"] == ["round 3 GCN base: rc 1: boom"]


def test_verdicts():
    assert commit_ab.verdict({"ratio": 1.5, "low": 1.35, "high": 1.6}, 1.3).startswith("met")
    assert commit_ab.verdict({"ratio": 1.5, "low": 1.1, "high": 1.9}, 1.3).startswith("point only")
    assert commit_ab.verdict({"ratio": 1.5, "low": None, "high": None}, 1.3).startswith("point only")
    assert commit_ab.verdict({"ratio": 1.2, "low": 1.1, "high": 1.3}, 1.3).startswith("not met")
    assert commit_ab.verdict(None, 1.3) == "no measurement"


def test_disagreeing_first_losses_or_graphs_are_flagged():
    runs = [_run(0, "GIN", "base", 100, loss=2.0), _run(0, "GIN", "head", 90, loss=2.01)]
    s = commit_ab.summarise(runs, ["GIN"], 1.3, 1e-4)
    assert not s["models"]["GIN"]["losses_agree"] and not s["agree"]
    runs = [_run(0, "GIN", "base", 100, graph="a"), _run(0, "GIN", "head", 90, graph="b")]
    s = commit_ab.summarise(runs, ["GIN"], 1.3, 1e-4)
    assert s["models"]["GIN"]["losses_agree"] and not s["agree"] and s["graphs"] == ["a", "b"]


def test_a_run_with_stand_in_children_writes_the_report(tmp_path, monkeypatch):
    """main() end to end with the children replaced (base 1.6x slower than head): the JSON holds
    every run and the commits, the table the CPU model and the verdicts; disagreeing losses give
    exit status 1."""
    monkeypatch.setattr(_common, "cpu_model", lambda: "Test CPU (family 0 model 0)")
    plots = []  # matplotlib's import alone is seconds: the plot has its own (slow) test
    monkeypatch.setattr(commit_ab, "plot", lambda p, path: plots.append(path))
    times = {"base": 160.0, "head": 100.0, "eager": 650.0, "csr": 240.0}

    def measure(side, model, r):
        return {"median_s": (times[side] + r) / 1e3, "first_loss": 2.5 if side in ("base", "head") else 0.0,
                "graph": "g", "rel_err": 0.0, "guard": []}

    argv = ["--base", "HEAD", "--rounds", "3", "--models", "GCN,GIN", "--results-dir", str(tmp_path), "--name", "ab"]
    assert commit_ab.main(argv, measure=measure) == 0
    p = json.loads((tmp_path / "ab.json").read_text())
    assert p["base"]["sha"] == commit_ab.resolve("HEAD") and p["cpu"].startswith("Test CPU")
    assert len(p["runs"]) == 3 * (2 * 2 + 2)
    assert p["summary"]["models"]["GCN"]["verdict"].startswith("met")
    assert p["summary"]["peers"]["csr"]["verdict"].startswith("not met")  # 2.4x < 2.5
    md = (tmp_path / "ab.md").read_text()
    assert "Test CPU" in md and "| GIN |" in md and "| csr |" in md and "disagree" not in md
    assert plots == [tmp_path / "ab.png"]

    def disagree(side, model, r):
        return dict(measure(side, model, r), first_loss=2.5 + (side == "head"))

    assert commit_ab.main(argv + ["--peers", ""], measure=disagree) == 1
    assert "disagree" in (tmp_path / "ab.md").read_text()


def test_the_child_refuses_gnncompile_from_another_tree(tmp_path):
    opts = argparse.Namespace(tree=str(tmp_path), model="GCN", nodes=50, features=4, variant="gnncompile",
                              threads=1, warmup=0, repeats=1)
    with pytest.raises(commit_ab.CommitABError, match="was imported from"):
        commit_ab.child(opts)


def test_child_command_loads_the_benchmarks_from_this_checkout():
    cmd = commit_ab.child_command(None, "GCN", "eager", _opts())
    assert cmd[:2] == [sys.executable, "-c"] and cmd[3] == str(_common.ROOT) and cmd[4] == ""
    assert cmd[cmd.index("--variant") + 1] == "eager" and cmd[cmd.index("--nodes") + 1] == "200"


@pytest.mark.slow
def test_real_children_time_this_checkout_and_refuse_an_unbuilt_tree():
    """A child of this checkout as installed times the compiled step (first loss and graph digest
    reported); a child pointed at this checkout's source folder, where no native module is
    installed, imports gnncompile from there (the editable install bypassed) and refuses to
    time the reference fallback."""
    res = commit_ab._run_child(None, "GCN", "gnncompile", _opts())
    assert "median_s" in res, res
    assert res["first_loss"] > 0 and len(res["graph"]) == 16
    assert str(_common.ROOT) in res["where"]["gnncompile"] and res["where"]["native"]
    res = commit_ab._run_child(_common.ROOT, "GCN", "gnncompile", _opts())
    assert "error" in res and "did not load" in res["error"], res


def test_append_adds_rounds_to_the_same_measurement_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(commit_ab, "plot", lambda p, path: None)

    def measure(side, model, r):
        return {"median_s": 0.2 if side == "base" else 0.1, "first_loss": 1.0, "graph": "g", "rel_err": 0.0}

    argv = ["--base", "HEAD", "--models", "GIN", "--peers", "", "--results-dir", str(tmp_path)]
    assert commit_ab.main(argv + ["--append"], measure=measure) == 2  # nothing to add to
    assert "no earlier result" in capsys.readouterr().err
    assert commit_ab.main(argv + ["--rounds", "2"], measure=measure) == 0
    assert commit_ab.main(argv + ["--rounds", "1", "--append"], measure=measure) == 0
    p = json.loads((tmp_path / "commit_ab.json").read_text())
    assert sorted({r["round"] for r in p["runs"]}) == [0, 1, 2] and p["options"]["rounds"] == 3
    assert [r["order"] for r in p["runs"] if r["side"] == "base"] == ["base then head", "head then base",
                                                                      "base then head"]
    assert len(p["sessions"]) == 2 and p["summary"]["models"]["GIN"]["pairs"] == 3
    assert "Run 2 (rounds 2)" in (tmp_path / "commit_ab.md").read_text()
    assert commit_ab.main(argv + ["--repeats", "3", "--append"], measure=measure) == 2
    assert "repeats 7 there, 3 now" in capsys.readouterr().err
    assert commit_ab.main(argv + ["--base", "HEAD~1", "--append"], measure=measure) == 2
    assert "base" in capsys.readouterr().err


@pytest.mark.slow
def test_the_plot_draws_every_speed_up(tmp_path):
    pytest.importorskip("matplotlib")
    iv = {"ratio": 1.5, "low": 1.4, "high": 1.6}
    p = {"summary": {"models": {"GCN": {"speedup": iv, "target": 1.3}, "GIN": {"speedup": None, "target": 1.3}},
                     "peers": {"eager": {"model": "GCN", "head_over_peer": dict(iv, low=None, high=None),
                                         "target": 6.0}}},
         "head": {"short": "aaa"}, "base": {"short": "bbb"}, "options": {"nodes": 100, "features": 8}}
    commit_ab.plot(p, tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 1000


def test_guard_steps_of_a_base_without_the_guards_recheck(monkeypatch):
    # the commit before issue 26 (commit_ab's default base) has no re-check of a close win: its
    # children stepped past the guard through _common.guard_steps, which read RECHECK_AFTER
    from gnncompile.compiler import guard

    with_recheck = _common.guard_steps()
    assert with_recheck == (_common.GUARD_STEPS + guard.RECHECK_AFTER + 2 + 2 * guard.RECHECK_SAMPLES)
    monkeypatch.delattr(guard, "RECHECK_AFTER")
    monkeypatch.delattr(guard, "RECHECK_SAMPLES")
    assert _common.guard_steps() == _common.GUARD_STEPS < with_recheck


@pytest.mark.parametrize("family, model, generation", [
    (23, 0x31, "Zen 2"), (23, 0x08, "Zen / Zen+"), (25, 0x01, "Zen 3"), (25, 0x21, "Zen 3"),
    (25, 0x11, "Zen 4"), (25, 0x61, "Zen 4"), (25, 0xA0, "Zen 4"), (26, 0x02, "Zen 5"), (6, 0x8F, "")])
def test_the_tables_name_the_amd_generation_by_family_and_model(family, model, generation):
    # the project's Zen 4 (family 25 model 17) was printed as "Zen 3 / Zen 4"
    assert _common._amd_generation(family, model) == generation
