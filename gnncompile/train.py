"""Trains a compiled GraphSAGE on sampled mini-batches, in one process or data-parallel over many.

    python -m gnncompile.train                                   # one process, a generated graph
    python -m gnncompile.train --data cora --epochs 20           # Cora from the Planetoid raw files
    torchrun --standalone --nproc-per-node 2 -m gnncompile.train # 2 ranks on this machine
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 \\
        --master-addr HOST0 --master-port 29500 -m gnncompile.train   # on HOST0; --node-rank 1 on HOST1

The same command runs in one process or as every rank of a ``torchrun`` job (it reads the
process group from torchrun's environment: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``). gloo on
CPUs, NCCL on CUDA (``--backend``). What a run does:

* the graph: generated (``power_law_graph``, features with labels a 2-layer mean aggregation
  can learn) or Cora (``--data cora``: the raw Planetoid files under ``--root``, copied before
  processing), built once per host and shared by its ranks through shared memory
  (:func:`gnncompile.data.shared_graph`), with the sampler's CSC;
* the batches: :class:`gnncompile.data.NeighborLoader` with ``distributed=True``: one shuffle of
  the training seeds per epoch from the shared ``--seed``, each rank its own equal share (so
  every rank runs the same number of steps and DDP never waits on a rank that ran out);
* the model: ``GraphSAGE`` (``torch_geometric.nn.models``) built from ``--seed`` (the same
  weights on every rank), compiled with :func:`gnncompile.compile` and wrapped in
  ``DistributedDataParallel`` (``--order compile-ddp`` compiles the DDP module instead;
  ``--eager`` leaves the model uncompiled);
* checkpoints: ``--checkpoint PATH`` is written after every epoch by rank 0 (to a temporary
  file, then renamed: a failure mid-write leaves the previous checkpoint whole) with the model,
  the optimizer and the epoch; ``--resume`` continues from it, with the next epoch's batches, so
  a run stopped and resumed ends with the parameters of a run that was never stopped. A
  checkpoint from another model configuration is refused.

Per epoch rank 0 prints the mean training loss over all ranks, the seeds per second of the whole
job and the epoch time; ``--json PATH`` writes them (and the final parameters' checksum).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

#: a distributed run's DDP module and the tensors it all-reduced itself, kept to the end of the
#: process (see _leave)
_ALIVE: list = []
#: the arguments that define the model and the data: a checkpoint must match them to resume
MODEL_ARGS = ("data", "nodes", "degree", "features", "classes", "hidden", "layers", "seed")
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "planetoid"


def parser(p: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``p`` (the ``gnncompile train`` subcommand's), its
    arguments are added to ``p``."""
    if p is None:
        p = argparse.ArgumentParser(prog="python -m gnncompile.train", description=__doc__.split("\n\n")[0],
                                    formatter_class=argparse.RawDescriptionHelpFormatter,
                                    epilog="One process or a torchrun job; see the module's docstring.")
    a = p.add_argument
    a("--data", choices=("synthetic", "cora"), default="synthetic", help="the graph (default: generated)")
    a("--root", default=str(DEFAULT_ROOT), help="for --data cora: a folder holding Cora/raw (read only)")
    a("--nodes", type=int, default=50_000, help="generated graph: nodes")
    a("--degree", type=int, default=10, help="generated graph: average in-degree")
    a("--features", type=int, default=64, help="generated graph: node features")
    a("--classes", type=int, default=8, help="generated graph: classes")
    a("--hidden", type=int, default=128)
    a("--layers", type=int, default=2)
    a("--fanout", default="10,5", help="neighbors sampled per hop, comma-separated (-1: all)")
    a("--batch-size", type=int, default=512, help="seed nodes per batch and rank")
    a("--epochs", type=int, default=3)
    a("--lr", type=float, default=3e-3)
    a("--seed", type=int, default=0, help="weights, labels and every epoch's shuffle")
    a("--eager", action="store_true", help="do not compile (the reference)")
    a("--order", choices=("ddp-compile", "compile-ddp"), default="ddp-compile",
      help="DDP(gnncompile.compile(model)) or gnncompile.compile(DDP(model))")
    a("--bucket-cap-mb", type=float, default=25.0, help="DDP's gradient bucket size")
    a("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl on CUDA, else gloo")
    a("--device", choices=("auto", "cpu", "cuda"), default="auto")
    a("--threads", type=int, default=None, help="torch threads per rank (default: torch's)")
    a("--checkpoint", default=None, help="write the model and optimizer here after every epoch")
    a("--resume", action="store_true", help="continue from --checkpoint when it exists")
    a("--max-steps", type=int, default=None, help="stop after this many steps (all epochs together)")
    a("--timeout", type=float, default=600.0, help="seconds a rank waits for the others")
    a("--json", default=None, help="write the per-epoch figures here (rank 0)")
    a("--quiet", action="store_true", help="no progress bar")
    return p


class TrainError(RuntimeError):
    """A training run cannot start or resume (bad arguments, a foreign checkpoint, no data)."""


def _fanout(text: str):
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(v == 0 or v < -1 for v in out):
        raise TrainError(f"--fanout: comma-separated integers >= 1 (or -1 for all), got {text!r}")
    return out


def _synthetic(args):
    """A power-law graph whose labels a 2-layer mean aggregation can learn: each class is the
    argmax of a fixed random projection of the node's features plus its in-neighbors' mean."""
    import torch
    from torch_geometric.data import Data
    from torch_geometric.utils import scatter

    from .data import power_law_graph

    N, F, C = args.nodes, args.features, args.classes
    g = torch.Generator().manual_seed(args.seed)
    edge_index = power_law_graph(N, N * args.degree, seed=args.seed)
    x = torch.randn(N, F, generator=g)
    mean = scatter(x[edge_index[0]], edge_index[1], dim=0, dim_size=N, reduce="mean")
    y = ((x + mean) @ torch.randn(F, C, generator=g)).argmax(1)
    train = torch.randperm(N, generator=g)[: N // 2].sort().values
    return Data(x=x, edge_index=edge_index, y=y, train_idx=train)


def _cora(args):
    from torch_geometric.datasets import Planetoid

    raw = Path(args.root) / "Cora" / "raw"
    if not raw.is_dir() or not any(raw.iterdir()):
        raise TrainError(f"--data cora: the raw Cora files are not in {raw} (pass --root DIR with DIR/Cora/raw)")
    tmp = tempfile.mkdtemp(prefix="gnncompile_cora_")
    try:
        shutil.copytree(raw, os.path.join(tmp, "Cora", "raw"))  # processing writes next to raw/
        data = Planetoid(tmp, "Cora")[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data.train_idx = data.train_mask.nonzero().view(-1)
    data.val_idx = data.val_mask.nonzero().view(-1)
    for k in ("train_mask", "val_mask", "test_mask"):
        del data[k]
    return data


def _graph(args):
    from .data import shared_graph

    build = (lambda: _cora(args)) if args.data == "cora" else (lambda: _synthetic(args))
    key = f"train-{args.data}" + ("" if args.data == "cora" else
                                  f"-{args.nodes}-{args.degree}-{args.features}-{args.classes}-{args.seed}")
    return shared_graph(key, build, timeout=args.timeout)


class _Dist:
    """The process group from torchrun's environment, or one process."""

    def __init__(self, args) -> None:
        import torch
        import torch.distributed as dist

        from .config import ConfigError, launcher

        try:
            launch = launcher()
        except ConfigError as e:
            raise TrainError(str(e)) from None
        self.world, self.rank, self.local_rank = launch.world_size, launch.rank, launch.local_rank
        cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
        if cuda and not torch.cuda.is_available():
            raise TrainError("--device cuda: torch sees no CUDA device")
        self.device = torch.device(f"cuda:{self.local_rank}") if cuda else torch.device("cpu")
        backend = args.backend if args.backend != "auto" else ("nccl" if cuda else "gloo")
        if backend == "nccl" and not cuda:
            raise TrainError("--backend nccl needs CUDA devices (gloo runs on CPUs)")
        self.backend = backend
        self.active = self.world > 1
        if self.active:
            if cuda:
                torch.cuda.set_device(self.device)
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))

    def reduce(self, values, op: str = "sum"):
        """``values`` (floats) summed, or their maximum, over the ranks, on every rank."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        if self.active:
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
            _ALIVE.append(t)  # gloo's worker thread may release it after this returns
        return t.tolist()

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.active:
            dist.barrier()

    def close(self) -> None:
        import torch.distributed as dist

        if self.active and dist.is_initialized():
            dist.barrier()  # every rank done with its collectives
            dist.destroy_process_group()  # (DDP's reducer, kept in _ALIVE, still holds the group)


def _model(args, in_channels: int, out_channels: int):
    import torch
    from torch_geometric.nn.models import GraphSAGE

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    return GraphSAGE(in_channels, args.hidden, args.layers, out_channels)


def _wrap(args, model, dist_: _Dist):
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gnncompile

    def ddp(m):
        if not dist_.active:
            return m
        ids = [dist_.device.index] if dist_.device.type == "cuda" else None
        return DDP(m, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)

    if args.eager:
        return ddp(model)
    if args.order == "compile-ddp":
        return gnncompile.compile(ddp(model), dynamic=True)
    return ddp(gnncompile.compile(model, dynamic=True))


def _form(args, dist_: _Dist) -> str:
    if not dist_.active:
        return "eager" if args.eager else "gnncompile.compile(model)"
    if args.eager:
        return "DDP(model)"
    return "gnncompile.compile(DDP(model))" if args.order == "compile-ddp" else "DDP(gnncompile.compile(model))"


def _config(args) -> Dict[str, Any]:
    return {k: getattr(args, k) for k in MODEL_ARGS}


def save_checkpoint(path: str, model, optimizer, epoch: int, steps: int, config: Dict[str, Any]) -> None:
    """Writes the checkpoint to ``path`` through a temporary file in the same folder and a
    rename, so a reader sees the previous checkpoint or this one, never half of one."""
    import torch

    import gnncompile

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="tmp-checkpoint-", suffix=".pt", dir=folder)
    os.close(fd)
    try:
        torch.save({"model": gnncompile.state_dict(model), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "steps": steps, "config": config, "format": "gnncompile.train/1"}, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_checkpoint(path: str, config: Dict[str, Any]) -> Dict[str, Any]:
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same error to the user
        raise TrainError(f"--resume: cannot read the checkpoint {path}: {e}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != "gnncompile.train/1":
        raise TrainError(f"--resume: {path} is not a checkpoint of python -m gnncompile.train")
    diff = {k: (ckpt["config"].get(k), v) for k, v in config.items() if ckpt["config"].get(k) != v}
    if diff:
        shown = ", ".join(f"--{k.replace('_', '-')} {old} in the checkpoint, {new} now" for k, (old, new) in diff.items())
        raise TrainError(f"--resume: {path} was written for another model or graph ({shown})")
    return ckpt


def _accuracy(model, data, device) -> Optional[float]:
    """The model as written, on the whole graph: accuracy on the validation nodes (Cora's
    val_mask; on a generated graph the nodes not trained on)."""
    import torch

    if "val_idx" in data:
        idx = data.val_idx
    else:
        mask = torch.ones(data.num_nodes, dtype=torch.bool)
        mask[data.train_idx] = False
        idx = mask.nonzero().view(-1)
    if idx.numel() == 0:
        return None
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            pred = model(data.x.to(device), data.edge_index.to(device)).argmax(1).cpu()
    finally:
        model.train(was)
    return float((pred[idx] == data.y[idx]).float().mean())


def _checksum(model) -> float:
    import torch

    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in model.parameters()))


def run(args) -> Dict[str, Any]:
    """Trains as the arguments say; returns the figures (rank 0's view)."""
    import torch
    import torch.nn.functional as F

    from .data import NeighborLoader

    if args.threads:
        torch.set_num_threads(args.threads)
    fanout = _fanout(args.fanout)
    if args.batch_size < 1 or args.epochs < 0:
        raise TrainError("--batch-size must be >= 1 and --epochs >= 0")
    if args.resume and not args.checkpoint:
        raise TrainError("--resume needs --checkpoint PATH")
    dist_ = _Dist(args)
    try:
        data = _graph(args)
        num_classes = int(data.y.max()) + 1 if args.data == "cora" else args.classes
        model = _model(args, data.num_features, num_classes).to(dist_.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        start_epoch, steps = 0, 0
        if args.resume and os.path.exists(args.checkpoint):
            ckpt = load_checkpoint(args.checkpoint, _config(args))
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            start_epoch, steps = ckpt["epoch"] + 1, ckpt["steps"]
        net = _wrap(args, model, dist_)
        if dist_.active:
            _ALIVE.append(net)
        loader = NeighborLoader(data, fanout, input_nodes=data.train_idx, batch_size=args.batch_size,
                                shuffle=True, seed=args.seed, distributed=dist_.active)
        lead = dist_.rank == 0
        if lead:
            print(f"gnncompile.train: {dist_.world} rank(s), {dist_.backend if dist_.active else 'one process'}, "
                  f"{dist_.device}; graph {args.data}: {data.num_nodes} nodes, {data.num_edges} edges, "
                  f"{data.train_idx.numel()} training seeds; GraphSAGE({data.num_features}, {args.hidden}, "
                  f"{args.layers}, {num_classes}) {_form(args, dist_)}; "
                  f"{len(loader)} batches of {args.batch_size} per rank and epoch", flush=True)
            if start_epoch:
                print(f"resumed from {args.checkpoint} after epoch {start_epoch - 1} ({steps} steps)", flush=True)
        epochs = []
        for epoch in range(start_epoch, args.epochs):
            loader.set_epoch(epoch)
            bar = _bar(len(loader), f"epoch {epoch}", disable=args.quiet or not lead)
            t0, loss_sum, seeds = time.perf_counter(), 0.0, 0
            step_s, wait_s = [], []  # a step (zero_grad .. optimizer step, the all-reduce in it); the wait for its batch
            it, t_wait = iter(loader), time.perf_counter()
            for batch in it:
                if args.max_steps is not None and steps >= args.max_steps:
                    break
                t_step = time.perf_counter()
                batch = batch.to(dist_.device)
                bs = batch.batch_size
                optimizer.zero_grad()
                out = net(batch.x, batch.edge_index)[:bs]
                loss = F.cross_entropy(out, batch.y[:bs])
                loss.backward()
                optimizer.step()
                loss_sum, seeds, steps = loss_sum + loss.item() * bs, seeds + bs, steps + 1
                t_end = time.perf_counter()
                step_s.append(t_end - t_step)
                wait_s.append(t_step - t_wait)
                t_wait = t_end
                bar.update(1)
            bar.close()
            loss_total, total_seeds = dist_.reduce([loss_sum, seeds])
            (elapsed,) = dist_.reduce([time.perf_counter() - t0], "max")  # the slowest rank's epoch
            loss_mean = loss_total / max(total_seeds, 1.0)
            rec = {"epoch": epoch, "loss": loss_mean, "seeds": int(total_seeds), "seconds": elapsed,
                   "seeds_per_s": total_seeds / elapsed if elapsed > 0 else 0.0, "steps": steps,
                   "step_ms_median": 1e3 * statistics.median(step_s) if step_s else None,
                   "batch_wait_ms_median": 1e3 * statistics.median(wait_s) if wait_s else None}
            epochs.append(rec)
            if lead:
                print(f"epoch {epoch}: loss {loss_mean:.4f}, {rec['seeds_per_s']:.0f} seeds/s "
                      f"({int(total_seeds)} seeds in {elapsed:.2f} s)", flush=True)
            if args.checkpoint:
                if lead:
                    save_checkpoint(args.checkpoint, model, optimizer, epoch, steps, _config(args))
                dist_.barrier()
            if args.max_steps is not None and steps >= args.max_steps:
                break
        val_acc = _accuracy(model, data, dist_.device) if lead else None
        if lead and val_acc is not None:
            print(f"validation accuracy (full graph, {'Cora val_mask' if args.data == 'cora' else 'nodes not trained on'}): "
                  f"{val_acc:.3f}", flush=True)
        result = {"world_size": dist_.world, "val_acc": val_acc, "backend": dist_.backend, "device": str(dist_.device),
                  "epochs": epochs, "steps": steps, "param_checksum": _checksum(model),
                  "args": {k: v for k, v in vars(args).items()}}
        if lead and args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return result
    finally:
        dist_.close()


def _bar(total: int, desc: str, disable: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        disable = True
    if disable or not sys.stderr.isatty():
        class _Null:
            def update(self, n):
                pass

            def close(self):
                pass
        return _Null()
    return tqdm(total=total, desc=desc, leave=False)


def _leave(code: int) -> None:
    """Ends a distributed run's process now, files written and output flushed, without the
    interpreter's teardown: freeing DDP's reducer frees the gloo process group, whose destructor
    joins its worker threads while holding the GIL, and a worker that is still releasing a
    finished all-reduce needs the GIL: both wait for ever (seen in about one 2-rank job of three
    on a loaded machine). The shared graph's files are removed first."""
    from .data import shared

    shared.release_files()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None, args: Optional[argparse.Namespace] = None, prog: str = "gnncompile.train") -> int:
    """The command line: runs :func:`run`; 2 for a :class:`TrainError` (printed in one line). A
    distributed run's process ends here (:func:`_leave`), with the status as its exit code."""
    if args is None:
        args = parser().parse_args(argv)
    warnings.filterwarnings("ignore", module="torch_geometric")
    code = 0
    try:
        run(args)
    except TrainError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        code = 2
    except BaseException:
        if not _ALIVE:
            raise
        traceback.print_exc()
        code = 1
    if _ALIVE:
        _leave(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
