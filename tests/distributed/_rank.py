"""One rank of tests/distributed/test_ddp_compiled.py, started by torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed/_rank.py OUT SPECS

SPECS is a JSON list of scenarios (see :func:`run_scenario`); each trains a fresh GraphSAGE,
built from seed 0, in DDP (gloo) around or inside ``gnncompile.compile`` and writes
``OUT/<name>.rank<r>.pt``: the parameters after training, the losses, the error if training
failed, and where asked ``gnncompile.explain``'s report (rank 0). Each rank writes its process
id to ``OUT/pid.rank<r>`` first, so that the test can ask a hung rank for its stacks (SIGUSR1)
and kill it.

The test imports this module too (tests/distributed is on sys.path while its tests run) for the
model, the batches and the one-process reference, so both sides use the same definitions.
"""
from __future__ import annotations

import datetime
import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FEATURES, HIDDEN, LAYERS, CLASSES = 16, 32, 3, 4
WORLD = 2
SEEDS = 16  # the loss is taken over each batch's first SEEDS nodes (its seed nodes)
LR, MOMENTUM = 0.1, 0.5
ORDERS = {"ddp-compile": "DDP(gnncompile.compile(model))", "compile-ddp": "gnncompile.compile(DDP(model))"}


def make_model(spec: dict) -> torch.nn.Module:
    """The scenario's model, the same in every process (weights from seed 0); ``unused``: with
    a parameter that forward never uses (DDP's find_unused_parameters case)."""
    from torch_geometric.nn.models import GraphSAGE

    torch.manual_seed(0)
    model = GraphSAGE(FEATURES, spec.get("hidden", HIDDEN), num_layers=spec.get("layers", LAYERS),
                      out_channels=CLASSES)
    if spec.get("unused"):
        model.unused = torch.nn.Linear(CLASSES, CLASSES)
    return model


def make_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def random_batch(rank: int, step: int):
    """(x, edge_index, y, seeds) of rank ``rank``'s batch number ``step``: a random subgraph whose
    size changes from batch to batch, the same in every process."""
    g = torch.Generator().manual_seed(1000 * rank + step + 1)
    n = int(torch.randint(40, 61, (1,), generator=g))
    x = torch.randn(n, FEATURES, generator=g)
    edge_index = torch.randint(0, n, (2, 4 * n), generator=g)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return x, edge_index, y, SEEDS


def loader_has_shards() -> bool:
    """Whether gnncompile.data.NeighborLoader takes ``num_replicas`` and ``rank``."""
    import inspect

    from gnncompile.data import NeighborLoader

    params = inspect.signature(NeighborLoader).parameters
    return "num_replicas" in params and "rank" in params


def loader_batches(rank: int, train_nodes: int) -> list:
    """Rank ``rank``'s batches (one epoch) of ``NeighborLoader(..., num_replicas=2, rank=rank)``
    over a fixed graph with ``train_nodes`` seed nodes."""
    from torch_geometric.data import Data

    from gnncompile.data import NeighborLoader, power_law_graph

    nodes = 300
    g = torch.Generator().manual_seed(7)
    data = Data(x=torch.randn(nodes, FEATURES, generator=g), y=torch.randint(0, CLASSES, (nodes,), generator=g),
                edge_index=power_law_graph(nodes, 6 * nodes, seed=0), num_nodes=nodes)
    train = torch.randperm(nodes, generator=g)[:train_nodes]
    loader = NeighborLoader(data, [5, 5], input_nodes=train, batch_size=SEEDS, shuffle=True, seed=0,
                            num_replicas=WORLD, rank=rank)
    return [(b.x, b.edge_index, b.y, b.batch_size) for b in loader]


def rank_batches(spec: dict, rank: int) -> list:
    """The batches rank ``rank`` trains on in scenario ``spec``: ``steps[rank]`` random
    subgraphs, or (data='loader') its shard of a NeighborLoader's epoch."""
    if spec.get("data") == "loader":
        return loader_batches(rank, spec["train_nodes"])
    return [random_batch(rank, s) for s in range(spec["steps"][rank])]


def batch_loss(out, y, seeds):
    return F.cross_entropy(out[:seeds], y[:seeds])


def reference(spec: dict, ranks=range(WORLD)):
    """One process doing the scenario's global batches with the model as written: per step,
    the losses of the ranks (of ``ranks``) that still have a batch, summed and divided by the
    world size (DDP averages the gradients over the ranks; under ``join()`` a rank that has run
    out contributes zeros and the sum is still divided by the initial world size), backward,
    optimizer step. Returns ({name: parameter}, [loss per step])."""
    model = make_model(spec)
    opt = make_optimizer(model.parameters())
    per_rank = [rank_batches(spec, r) for r in ranks]
    losses = []
    for s in range(max(len(b) for b in per_rank)):
        opt.zero_grad(set_to_none=True)
        total = 0
        for batches in per_rank:
            if s < len(batches):
                x, ei, y, seeds = batches[s]
                total = total + batch_loss(model(x, ei), y, seeds)
        loss = total / WORLD
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


# ----------------------------------------------------------------------------- one rank
def wrap(model, spec: dict):
    """The scenario's training module around ``model`` (its parameters are the model's)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gnncompile

    kw = dict(spec.get("ddp", {}))
    if spec.get("bucket_cap_mb") is not None:
        kw["bucket_cap_mb"] = spec["bucket_cap_mb"]
    if spec["order"] == "ddp-compile":
        return DDP(gnncompile.compile(model, dynamic=True), **kw)
    if spec["order"] == "compile-ddp":
        return gnncompile.compile(DDP(model, **kw), dynamic=True)
    raise ValueError(f"unknown order {spec['order']!r}")


def run_scenario(spec: dict, rank: int, out: Path) -> bool:
    """Trains scenario ``spec`` on this rank and writes OUT/<name>.rank<r>.pt; whether it
    succeeded.

    spec: name; order ('ddp-compile' or 'compile-ddp'); steps ([batches of rank 0, of rank 1])
    or data='loader' with train_nodes; hidden, layers, unused (the model); bucket_cap_mb and
    ddp (DDP's other keyword arguments); join (train inside DDP's ``join()``); explain (rank 0
    explains the trained module on its first batch afterwards)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gnncompile
    from gnncompile.compiler import STATS, CompiledModule, collect

    torch._dynamo.reset()  # each scenario compiles its own model afresh
    t0 = time.perf_counter()
    result = {"name": spec["name"], "rank": rank, "losses": [], "error": None, "explain": None}
    model = make_model(spec)
    try:
        net = wrap(model, spec)
        ddp = net if isinstance(net, DDP) else net.model
        compiled = net if isinstance(net, CompiledModule) else net.module
        opt = make_optimizer(model.parameters())
        batches = rank_batches(spec, rank)
        result["batches"] = len(batches)
        graphs_before = STATS["graphs"]

        def train():
            for x, ei, y, seeds in batches:
                opt.zero_grad(set_to_none=True)
                loss = batch_loss(net(x, ei), y, seeds)
                loss.backward()
                opt.step()
                result["losses"].append(loss.item())

        with collect() as reports:  # the backend's report of every graph piece it compiled
            if spec.get("join"):
                with ddp.join():
                    train()
            else:
                train()
        result["backend_calls"] = STATS["graphs"] - graphs_before
        result["fused"] = sum(r.num_fused for r in reports)
        result["compile_failed"] = compiled._failed  # why compiling failed, where it ran eagerly
        if spec.get("explain") and rank == 0:
            x, ei, _, _ = batches[0]
            rep = gnncompile.explain(net, x, ei)
            result["explain"] = dict(rep.as_dict(), text=str(rep))
    except Exception as e:  # the test reports it
        result["error"] = f"{type(e).__name__}: {e}"[:3000]
        result["traceback"] = traceback.format_exc()[-6000:]
    result["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
    result["seconds"] = time.perf_counter() - t0
    torch.save(result, out / f"{spec['name']}.rank{rank}.pt")
    print(f"rank {rank}: {spec['name']} in {result['seconds']:.1f} s"
          + (f" (error: {result['error'][:300]})" if result["error"] else ""), file=sys.stderr, flush=True)
    return result["error"] is None


def main(argv) -> None:
    import warnings

    import torch.distributed as dist

    warnings.simplefilter("ignore")
    out, specs = Path(argv[0]), json.loads(argv[1])
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    (out / f"pid.rank{rank}").write_text(str(os.getpid()))
    # a collective left waiting this long fails instead of hanging (the test's timeout is the
    # last resort)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    assert dist.get_world_size() == WORLD, dist.get_world_size()
    try:
        for spec in specs:
            if not run_scenario(spec, rank, out):
                break  # the ranks may no longer agree on what comes next
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
    # without the interpreter's teardown, where freeing the last DDP objects can deadlock with
    # gloo's worker threads (gnncompile/train.py's _leave)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
