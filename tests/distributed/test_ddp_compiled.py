"""Data-parallel training of compiled models: 2 gloo ranks on this machine, started by torchrun.

Both orders, ``DDP(gnncompile.compile(model))`` and ``gnncompile.compile(DDP(model))``, train a
GraphSAGE on mini-batches and must end with the parameters of ONE process doing the same
global batches with the model as written (per step: the mean of the ranks' batch losses,
backward, SGD step): with the default buckets, with buckets small enough that Dynamo's DDP
optimizer splits the graph into 3 pieces (each of which must fuse), with uneven numbers of
batches under DDP's ``join()``, with a sharded ``NeighborLoader``, with ``static_graph=True``
and with ``find_unused_parameters=True``, and with the two ranks started as two machines
(two torchrun launchers, ``--nnodes 2``).

Every scenario runs in the rank processes of one torchrun launch (_rank.py, which also holds
the model, the batches and the one-process reference); each rank writes what it ended with,
and the tests below compare. A launch that outlives its timeout is a hang: the ranks are asked
for their Python stacks, killed with their process groups, and the tests fail.

Tolerance: float32 parameters after 3-5 SGD steps (lr 0.1, momentum 0.5) must match the one
process within rtol 1e-5, atol 1e-6. The ranks agree bitwise (they apply the same all-reduced
gradients), but the one process computes other roundings: the fused kernels sum each
neighbourhood in another order than eager's scatter_add, and DDP sums the ranks' gradients
divided by the world size where the reference's backward accumulates the halves of the mean
loss. Each is an error of a few ulps of a gradient, carried into the parameters scaled by the
learning rate: measured at most 1.5e-8 absolute (parameters of 0.01-0.3, so 1-2 ulps), 60x
under atol. A real fault moves the parameters by about lr * |gradient| >= 1e-3: a gradient
not averaged, a step missed, a rank's batches lost (the tests check that the reference of
rank 0's batches alone is outside the tolerance).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import _rank

pytestmark = pytest.mark.slow

RANK_SCRIPT = Path(_rank.__file__).resolve()
ROOT = RANK_SCRIPT.parents[2]
TIMEOUT_S = 180  # per launch: a hang fails here, not in CI's global timeout
TOL = dict(rtol=1e-5, atol=1e-6)
ORDERS = list(_rank.ORDERS)
# 2.31 MiB of parameters: with 1 MiB buckets (the smallest Dynamo's DDP optimizer accepts, see
# test_buckets_under_1_mib_fall_back_with_the_cause) DDP's optimizer cuts the graph in 3 pieces
SPLIT = dict(hidden=384, layers=4, bucket_cap_mb=1, steps=[3, 3])


def _scenarios() -> list:
    s = []
    for o in ORDERS:
        s.append(dict(name=f"parity-{o}", order=o, steps=[4, 4]))
    for o in ORDERS:
        s.append(dict(SPLIT, name=f"buckets-{o}", order=o, explain=True))
    for o in ORDERS:
        s.append(dict(name=f"join-{o}", order=o, steps=[5, 3], join=True))
    if _rank.loader_has_shards():  # 101 seed nodes: shards of 51 (one padded) -> 4 batches each
        s.append(dict(name="loader-compile-ddp", order="compile-ddp", data="loader", train_nodes=101))
    for o in ORDERS:
        s.append(dict(name=f"small-buckets-{o}", order=o, steps=[2, 2], bucket_cap_mb=0.5))
    # last: the DDP options (a failure there leaves the scenarios above reported). On the small
    # model, for time: with SPLIT's model and buckets (3 pieces) all four pass as well (measured
    # by hand; each takes twice as long)
    for flag in ("static_graph", "find_unused_parameters"):
        for o in ORDERS:
            s.append(dict(name=f"{flag}-{o}", order=o, steps=[4, 4], unused=True, ddp={flag: True}))
    return s


SCENARIOS = {s["name"]: s for s in _scenarios()}


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", GNNCOMPILE_GUARD="off", PYTHONWARNINGS="ignore")
    env.setdefault("GNNCOMPILE_INNER", "aot_eager")
    env.setdefault("GNNCOMPILE_PROGRAMS", "always")
    return env


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(pid: int, sig) -> None:
    try:
        os.killpg(pid, sig)  # the launcher and each rank lead a process group (session) of their own
    except (ProcessLookupError, PermissionError):
        pass


def _launch(out: Path, specs: list, launcher_args: list) -> dict:
    """Runs torchrun once per entry of ``launcher_args`` (each its own launcher process, its own
    session) with _rank.py and ``specs``; waits at most TIMEOUT_S for all. Returns {'logs':
    launchers' output (a hung rank's stacks included), 'hung': '' or what happened, 'rcs',
    'seconds'}."""
    out.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    t0 = time.monotonic()
    for i, args in enumerate(launcher_args):
        log = out / f"launcher{i}.log"
        logs.append(log)
        cmd = [sys.executable, "-m", "torch.distributed.run", *args, str(RANK_SCRIPT), str(out), json.dumps(specs)]
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=_env(),
                                          start_new_session=True))
    hung = ""
    try:
        for p in procs:
            p.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        ranks = [int(f.read_text()) for f in out.glob("pid.rank*") if f.read_text().strip()]
        for pid in ranks:  # their Python stacks (faulthandler) into the launcher's log
            _kill(pid, signal.SIGUSR1)
        time.sleep(2)
        for pid in ranks + [p.pid for p in procs]:
            _kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        hung = f"still running after {TIMEOUT_S} s (a hang); killed"
    text = "\n".join(f"--- {log.name}\n{log.read_text()[-6000:]}" for log in logs)
    return {"logs": text, "hung": hung, "rcs": [p.returncode for p in procs], "seconds": time.monotonic() - t0}


class Runs:
    """What the ranks of one launch wrote, per scenario."""

    def __init__(self, out: Path, launch: dict) -> None:
        self.out, self.launch = out, launch

    def get(self, name: str) -> list:
        """[rank 0's result, rank 1's] of scenario ``name``; fails the test, with the launch's
        output, where a rank wrote none or training raised."""
        files = [self.out / f"{name}.rank{r}.pt" for r in range(_rank.WORLD)]
        where = f"\n{self.launch['hung']}\nlauncher exit codes {self.launch['rcs']}\n{self.launch['logs']}"
        missing = [f.name for f in files if not f.exists()]
        if missing:
            pytest.fail(f"scenario {name}: no result from {missing}{where}")
        res = [torch.load(f, weights_only=False) for f in files]
        for r in res:
            if r["error"]:
                pytest.fail(f"scenario {name}, rank {r['rank']}: {r['error']}\n{r.get('traceback', '')}")
        return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    """Every scenario of SCENARIOS, in one torchrun launch of 2 ranks on this machine."""
    out = tmp_path_factory.mktemp("ddp")
    launch = _launch(out, list(SCENARIOS.values()), [["--standalone", "--nproc-per-node", "2"]])
    print(f"torchrun launch: {launch['seconds']:.1f} s")
    return Runs(out, launch)


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in b)


def check_parity(res: list, spec: dict, compiled: bool = True) -> None:
    """Both ranks end bitwise equal, and equal to the one process within TOL; the compiled form
    ran (``compiled``): nothing fell back to eager and the backend fused chains."""
    assert res[0]["params"].keys() == res[1]["params"].keys()
    for k in res[0]["params"]:
        assert torch.equal(res[0]["params"][k], res[1]["params"][k]), f"{spec['name']}: ranks differ at {k}"
    ref, ref_losses = _rank.reference(spec)
    assert res[0]["params"].keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(res[0]["params"][k], ref[k], **TOL,
                                   msg=lambda m: f"{spec['name']}: {k} differs from one process's: {m}")
    # the tolerance tells a fault apart: training moved the parameters, and the reference
    # without rank 1's batches (what a lost rank gives) is outside it
    start = _rank.make_model(spec).state_dict()
    assert _max_diff(ref, {k: start[k] for k in ref}) > 1e3 * TOL["atol"]
    alone, _ = _rank.reference(spec, ranks=[0])
    assert _max_diff(res[0]["params"], alone) > 1e2 * TOL["atol"]
    # the mean of the ranks' losses is the one process's loss, step by step (both ranks busy)
    both = min(len(r["losses"]) for r in res)
    mean = [(a + b) / 2 for a, b in zip(res[0]["losses"][:both], res[1]["losses"][:both])]
    torch.testing.assert_close(torch.tensor(mean), torch.tensor(ref_losses[:both]), rtol=1e-5, atol=1e-6)
    if compiled:
        for r in res:
            assert r["compile_failed"] is None, r["compile_failed"]
            assert r["backend_calls"] >= 1 and r["fused"] >= 1, (r["backend_calls"], r["fused"])


@pytest.mark.parametrize("order", ORDERS)
def test_parity_with_one_process(runs, order):
    name = f"parity-{order}"
    check_parity(runs.get(name), SCENARIOS[name])


@pytest.mark.parametrize("order", ORDERS)
def test_small_buckets_give_3_pieces_that_each_fuse(runs, order):
    name = f"buckets-{order}"
    res = runs.get(name)
    check_parity(res, SCENARIOS[name])
    rep = res[0]["explain"]
    assert rep is not None, "rank 0 did not explain"
    pieces = rep["pieces"]
    assert rep["num_graphs"] >= 3 and len(pieces) == rep["num_graphs"], rep["text"]
    assert all("DDPOptimizer" in p["graph_break"] for p in pieces), rep["text"]  # all from DDP's split
    assert [p["num_fused"] >= 1 for p in pieces] == [True] * len(pieces), rep["text"]
    assert sum(p["num_fused"] for p in pieces) == rep["num_fused"], rep["text"]
    split = [b for b in rep["graph_breaks"] if "gradient-bucket boundaries" in b["reason"]]
    assert [b["count"] for b in split] == [len(pieces) - 1], rep["text"]


@pytest.mark.parametrize("order", ORDERS)
def test_buckets_under_1_mib_fall_back_with_the_cause(runs, order):
    """torch's DDP optimizer refuses bucket_cap_mb < 1 (DDP's first bucket is 1 MiB: an
    AssertionError in torch._dynamo.backends.distributed): the compiled module trains as
    written, and its CompileFallbackWarning names the cause."""
    name = f"small-buckets-{order}"
    res = runs.get(name)
    check_parity(res, SCENARIOS[name], compiled=False)
    for r in res:
        assert r["compile_failed"] and "bucket_cap_mb >= 1" in r["compile_failed"], r["compile_failed"]


@pytest.mark.parametrize("order", ORDERS)
def test_uneven_batches_finish_under_join(runs, order):
    """Rank 0 has 5 batches, rank 1 has 3: inside ``join()`` rank 1 shadows rank 0's last two
    all-reduces with zeros (the sum still divided by 2, as the reference does), then DDP
    broadcasts the final parameters."""
    name = f"join-{order}"
    res = runs.get(name)
    assert [r["batches"] for r in res] == [5, 3]
    assert [len(r["losses"]) for r in res] == [5, 3]
    check_parity(res, SCENARIOS[name])


def test_sharded_neighbor_loader_gives_equal_batch_counts(runs):
    if "loader-compile-ddp" not in SCENARIOS:
        pytest.skip("gnncompile.data.NeighborLoader has no num_replicas / rank")
    res = runs.get("loader-compile-ddp")
    assert res[0]["batches"] == res[1]["batches"] == 4  # 101 seed nodes: 51 per rank, batches of 16
    check_parity(res, SCENARIOS["loader-compile-ddp"])


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("flag", ["static_graph", "find_unused_parameters"])
def test_ddp_options(runs, flag, order):
    """With a parameter that forward never uses (without find_unused_parameters or
    static_graph, DDP raises on the second step)."""
    name = f"{flag}-{order}"
    check_parity(runs.get(name), SCENARIOS[name])


def test_two_machines(tmp_path):
    """Two torchrun launchers, one rank each, as two machines would start them (static
    rendezvous at rank 0's address)."""
    specs = [dict(name=f"nodes-{o}", order=o, steps=[3, 3]) for o in ORDERS]
    port = _free_port()
    launch = _launch(tmp_path, specs, [
        ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(n), "--master-addr", "127.0.0.1",
         "--master-port", str(port), "--rdzv-backend", "static"] for n in (0, 1)])
    print(f"two launchers: {launch['seconds']:.1f} s")
    runs = Runs(tmp_path, launch)
    for s in specs:
        check_parity(runs.get(s["name"]), s)
