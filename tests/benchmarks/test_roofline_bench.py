"""The roofline benchmark (benchmarks/roofline.py): its traffic model, the agreement check that
comes before timing, and one tiny real run whose json and table are checked against each other
(ratios are the time ratios, percentages of the copy bandwidth, the x-compulsory figure)."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import roofline
from gnncompile.compiler import portfolio


def test_traffic_counts_each_array_once():
    # N=10, E=30, F=4, int32 indices: x 160 B, out 160 B, rowptr 11 x 4, col 30 x 4
    t = roofline.traffic(10, 30, 4, 4, backward=False)
    assert t == {"compulsory": 160 + 44 + 120 + 160, "gathered": 30 * 16 + 44 + 120 + 160}
    assert roofline.traffic(10, 30, 4, 4, backward=True) == {k: 2 * v for k, v in t.items()}


def test_roofline_figures():
    r = roofline.roofline(0.5, {"compulsory": 2e9, "gathered": 8e9}, copy_gbs=10.0)
    assert r["compulsory_gbs"] == pytest.approx(4.0) and r["compulsory_pct_copy"] == pytest.approx(40.0)
    assert r["gathered_gbs"] == pytest.approx(16.0) and r["gathered_pct_copy"] == pytest.approx(160.0)
    assert r["x_compulsory"] == pytest.approx(2.5)  # 0.5 s against 2 GB at 10 GB/s


def test_must_show_reads_the_100k_f128_forward():
    def res(N, F, x):
        return {"N": N, "F": F, "fwd": {"native": {"x_compulsory": x}}}
    assert roofline.must_show({"results": [res(20_000, 128, 1.0)]}) is None
    ms = roofline.must_show({"results": [res(20_000, 128, 1.0), res(100_000, 128, 2.5)]})
    assert ms["x_compulsory"] == 2.5 and ms["met"]
    assert not roofline.must_show({"results": [res(100_000, 128, 3.5)]})["met"]


def test_peers_that_disagree_are_not_timed(monkeypatch):
    from gnncompile.data.synthetic import power_law_graph

    real = portfolio.run_candidate
    monkeypatch.setattr(roofline.portfolio, "run_candidate",
                        lambda *a, **k: real(*a, **k) * 1.01)  # the native side off by 1%
    ei = power_law_graph(200, 2000, seed=0)
    dec = {8: portfolio.Decision("native", "test")}
    with pytest.raises(AssertionError, match="disagree"):
        roofline.point(ei, 200, 8, 3, 10.0, 60.0, dec)


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        roofline.main(["--nodes", "0"])
    with pytest.raises(SystemExit):
        roofline.main(["--huge-pages", "maybe"])


def test_huge_pages_on_is_recorded_and_the_allocator_is_wrapped(tmp_path):
    """--huge-pages on wraps torch's CPU allocator for the run (in a fresh interpreter: it is
    process-wide) and the json and the table say so."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from gnncompile.hardware import memory
    from gnncompile.ops import _native

    if not _native.native_loaded() or memory.thp_mode() is None:
        pytest.skip("needs the native extension and a kernel with transparent huge pages")
    code = ("import json, sys; from benchmarks import roofline; from gnncompile.hardware import memory; "
            f"rc = roofline.main(['--nodes', '300', '--features', '8', '--repeats', '3', '--copy-mib', '8', "
            f"'--out', {str(tmp_path)!r}, '--huge-pages', 'on']); print(json.dumps([rc, memory.status()['installed']]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2], env={**os.environ, "GNNCOMPILE_HUGE_PAGES": "off"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [0, True]
    assert json.loads((tmp_path / "roofline.json").read_text())["huge_pages"] == "on"
    assert "advised to huge pages for the whole run (--huge-pages on" in (tmp_path / "roofline.md").read_text()


def test_a_tiny_run_writes_a_consistent_table(tmp_path):
    argv = ["--nodes", "300", "1200", "--features", "8", "24", "--repeats", "4", "--point-budget", "0", "--copy-mib", "32",
            "--threads", str(torch.get_num_threads()), "--out", str(tmp_path), "--name", "tiny"]
    assert roofline.main(argv) == 0
    assert not (tmp_path / "roofline.json").exists()  # --name names the files
    p = json.loads((tmp_path / "tiny.json").read_text())
    md = (tmp_path / "tiny.md").read_text()
    assert p["huge_pages"] == "off" and "--huge-pages on" not in md
    copy = p["copy_gbs"]
    assert copy > 0 and p["command"] == "python -m benchmarks roofline " + " ".join(argv)
    assert [(r["N"], r["F"]) for r in p["results"]] == [(300, 8), (300, 24), (1200, 8), (1200, 24)]
    for r in p["results"]:
        assert r["E"] == 10 * r["N"] and r["repeats"] == 3  # the budget of 0 s: the fewest rounds
        assert r["agree"]["fwd"] <= 1e-4 and r["agree"]["grad_x"] <= 1e-4
        ib = torch.empty((), dtype=getattr(torch, r["index_dtype"])).element_size()
        for ps in ("fwd", "fwdbwd"):
            assert r[ps]["bytes"] == roofline.traffic(r["N"], r["E"], r["F"], ib, backward=ps == "fwdbwd")
            nat, ts = r[ps]["native"], r[ps]["torch_sparse"]
            assert r[ps]["ratio"] == pytest.approx(ts["median"] / nat["median"])
            for side in (nat, ts):
                assert side["n"] == 3 and side["min"] <= side["median"] <= side["max"]
                for kind in ("compulsory", "gathered"):
                    gbs = r[ps]["bytes"][kind] / side["median"] / 1e9
                    assert side[f"{kind}_gbs"] == pytest.approx(gbs)
                    assert side[f"{kind}_pct_copy"] == pytest.approx(100 * gbs / copy)
                assert side["x_compulsory"] == pytest.approx(side["median"] * copy * 1e9 / r[ps]["bytes"]["compulsory"])
        assert r["implementation"] == p["decisions"][str(r["F"])]["impl"]
        # the table's row holds the json's figures
        f, b = r["fwd"], r["fwdbwd"]
        ratio = f"{f['ratio']:.2f}"
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| {r['N']:,} | {r['E']:,} | {r['F']} |"))
        assert f"| {f['native']['median'] * 1e3:.2f} | {f['torch_sparse']['median'] * 1e3:.2f} |" in row
        assert (f"**{ratio}**" if f["ratio"] < 1.5 else f"| {ratio} |") in row
        assert f"| {b['native']['median'] * 1e3:.2f} | {b['torch_sparse']['median'] * 1e3:.2f} |" in row
        assert f"{f['native']['compulsory_pct_copy']:.0f}% " in row and row.endswith(f"| {f['native']['x_compulsory']:.2f} |")
    assert p["must_show"] is None and "is not in this grid" in md
    assert f"{copy:.1f} GB/s" in md and p["command"] in md and p["cpu"] in md
    assert "(300 x F8: 3, 300 x F24: 3, 1,200 x F8: 3, 1,200 x F24: 3 rounds, to keep each point under 0 s)" in md
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "tiny.png").stat().st_size > 0
    under = [r for r in p["results"] if min(r["fwd"]["ratio"], r["fwdbwd"]["ratio"]) < 1.5]
    assert f"under 1.5x torch.sparse (forward or forward + backward): {len(under)} of 4" in md
