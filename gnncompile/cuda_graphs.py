"""Training steps replayed as CUDA graphs, one graph per batch shape (bucket).

    loader = PooledLoader(dataset, batch_size=128, shuffle=True, device="cuda", pad_to_buckets=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    step = GraphedStep(model, opt, lambda m, b: F.cross_entropy(
        m(b.x, b.edge_index, b.batch, size=b.num_graphs), b.y, ignore_index=-100))
    for batch in loader:
        loss = step(batch)          # zero_grad, forward, loss, backward, optimizer step

``GraphedStep(model, optimizer, loss_fn)`` runs ``optimizer.zero_grad(); loss = loss_fn(model,
batch); loss.backward(); optimizer.step()``. On CUDA it does so by replaying a
``torch.cuda.CUDAGraph``: the first batch of each shape (the tensors' shapes and dtypes and
``batch.num_graphs``: with ``pad_to_buckets``, one per bucket; and the model's ``training``
flag) is copied into static buffers of
that shape; the step is warmed up there (``warmup`` runs on a side stream, as torch requires,
which also creates the optimizer's state), the parameters, buffers and optimizer state are put
back as they were before the warm-up (so the warm-up trains nothing: the captured steps give the
losses and parameters of the plain steps), and the step is captured. Every call then copies the
batch's tensors into the static buffers of its shape and replays that graph: no Python, no
kernel launches one by one, no allocation. It returns the loss (a new 0-d tensor: read it with
``.item()`` when you need it; that waits for the step).

On the CPU (the model's parameters on the CPU) it runs the plain step above, with the same
checks of the model, and captures nothing (``mode == "plain"``).

What it refuses (ValueError), before anything runs:

* a padded batch (one with ``node_mask``, from ``pad_to_buckets``) and a BatchNorm in training
  mode: its batch statistics would count the padding nodes (``model.eval()`` on it, or a
  per-graph norm: ``GraphNorm``, ``LayerNorm(mode='graph')``);
* on CUDA, an optimizer with a ``capturable`` option not set (``Adam(..., capturable=True)``):
  torch refuses to capture its step otherwise;
* on CUDA, an optimizer without state yet for some parameters (the first step) whose state the
  helper cannot put back after the warm-up: fresh states are reset to zero, right for Adam,
  AdamW, Adamax, RMSprop and SGD (dampening 0); for another optimizer, take one plain step first
  (then every state is copied back exactly);
* on CUDA, a step that draws random numbers (dropout, attention dropout: seen as a change of
  the CUDA generator's state during the first warm-up run), unless ``allow_random=True``:
  torch's capture then advances the default CUDA generator on each replay, as it requires
  (other generators must be registered with the graph, which this helper does not do); the
  numbers drawn differ from those of the plain step, so the results are equal in distribution
  only. The warm-up's draws are undone (the generator's state is put back).

A capture that fails (an op that waits on the host: ``.item()``, ``int(batch.max())`` in a
readout given no ``size``, boolean masking, PyG's ``add_remaining_self_loops`` in GCNConv)
raises RuntimeError saying so; the model and optimizer are put back as before the warm-up.

What ``loss_fn`` reads must be tensors of the batch: its Python numbers (``batch.padding``) are
those of the first batch of the shape, baked into the graph. Likewise a learning rate given as a
Python float is baked in (a scheduler's changes are not seen: give ``lr`` as a tensor). The
loss and the gradients (``p.grad``) live in the graph's memory and are overwritten by the next
step of that shape. Not supported: ``torch.amp`` gradient scaling, gradient accumulation over
several calls.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ["GraphedStep"]

# Optimizers whose fresh state (before their first step) is all zeros, so that a state created
# by the warm-up can be reset exactly (SGD: a momentum buffer starts as the first gradient,
# which a zero buffer reproduces when dampening is 0).
_ZERO_INIT = ("Adam", "AdamW", "Adamax", "RMSprop", "SGD")


def _tensors(batch) -> List[Tuple[str, torch.Tensor]]:
    if not hasattr(batch, "items") or not callable(batch.items):
        raise TypeError(f"GraphedStep: a batch must be a PyG Data / Batch, got {type(batch).__name__}")
    return [(k, v) for k, v in batch.items() if isinstance(v, torch.Tensor)]


def _shape_key(batch) -> tuple:
    ts = _tensors(batch)
    key = tuple((k, tuple(v.shape), v.dtype) for k, v in ts)
    return key + (("num_graphs", getattr(batch, "num_graphs", None)),)


def check_model(model: torch.nn.Module, batch) -> None:
    """ValueError where padding would change what the model computes for the real graphs: a
    BatchNorm in training mode and a padded batch (one with ``node_mask``)."""
    if "node_mask" not in getattr(batch, "keys", lambda: ())():
        return
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training:
            raise ValueError(f"GraphedStep: {name or type(model).__name__} ({type(m).__name__}) is in training "
                             "mode and the batch is padded: its batch statistics would count the padding nodes. "
                             "Put it in eval mode, or use a per-graph norm (GraphNorm, LayerNorm(mode='graph'))")


def check_optimizer(optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> None:
    """ValueError for an optimizer whose step a CUDA graph cannot capture (a ``capturable``
    option not set) or whose fresh state the warm-up could not put back exactly (see the
    module docstring)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"GraphedStep: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    name = type(optimizer).__name__
    for g in optimizer.param_groups:
        if "capturable" in g and not g["capturable"]:
            raise ValueError(f"GraphedStep: {name} was built with capturable=False; a CUDA graph can capture its "
                             f"step only with {name}(..., capturable=True)")
    fresh = [p for p in params if p.requires_grad and not optimizer.state.get(p)]
    if not fresh:
        return
    if name not in _ZERO_INIT:
        raise ValueError(f"GraphedStep: {name} has no state yet for {len(fresh)} parameter(s), and the helper "
                         f"can only reset the fresh state of {', '.join(_ZERO_INIT)} after the warm-up; take "
                         "one plain step first (every state is then copied back exactly)")
    if name == "SGD":
        for g in optimizer.param_groups:
            if g.get("momentum", 0) and g.get("dampening", 0):
                raise ValueError("GraphedStep: SGD with momentum and dampening != 0 starts its momentum buffer "
                                 "from the first gradient, which a reset cannot reproduce; take one plain step first")


class _Snapshot:
    """Parameters, buffers and optimizer state, to put back after the warm-up."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.params = [(p, p.detach().clone()) for p in model.parameters()]
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]
        self.model = model
        self.optimizer = optimizer
        self.state: Dict[Any, Dict[str, Any]] = {}
        for p, st in optimizer.state.items():
            self.state[p] = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                             for k, v in st.items()}

    def restore(self) -> None:
        with torch.no_grad():
            for p, v in self.params:
                p.copy_(v)
            for b, v in self.buffers:
                b.copy_(v)
            for p, st in list(self.optimizer.state.items()):
                old = self.state.get(p)
                for k, v in list(st.items()):
                    if old is not None and k in old:
                        if isinstance(v, torch.Tensor):
                            v.copy_(old[k])  # in place: the captured step reads this memory
                        else:
                            st[k] = copy.deepcopy(old[k])
                    elif isinstance(v, torch.Tensor):
                        v.zero_()  # a state the warm-up created: fresh (see _ZERO_INIT)
                    elif isinstance(v, (int, float)):
                        st[k] = type(v)(0)


class _Captured:
    def __init__(self, graph, static, inputs, loss) -> None:
        self.graph = graph
        self.static = static
        self.inputs = inputs  # [(key, static tensor)]
        self.loss = loss


class GraphedStep:
    """One training step (zero_grad, forward, loss, backward, optimizer step) replayed as a CUDA
    graph per batch shape; the plain step on the CPU. See the module docstring.

    Args:
        model: the module (its parameters on one device).
        optimizer: its optimizer (on CUDA: ``capturable=True`` where it has the option).
        loss_fn: ``loss_fn(model, batch) -> 0-d tensor``; must not wait on the host.
        warmup: warm-up runs before a capture (>= 1; default 3).
        allow_random: accept a step that draws random numbers (CUDA; see the module docstring).

    Attributes: ``mode`` ("cuda_graph" or "plain"), ``captures`` (graphs captured), ``replays``.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *, warmup: int = 3,
                 allow_random: bool = False) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"GraphedStep: model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise TypeError("GraphedStep: loss_fn must be callable as loss_fn(model, batch)")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"GraphedStep: warmup must be an integer >= 1, got {warmup!r}")
        params = list(model.parameters())
        if not params:
            raise ValueError("GraphedStep: the model has no parameters")
        devices = {p.device for p in params}
        if len(devices) != 1:
            raise ValueError(f"GraphedStep: the model's parameters are on several devices {sorted(map(str, devices))}")
        self.device = devices.pop()
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"GraphedStep: optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.warmup = warmup
        self.allow_random = bool(allow_random)
        self.mode = "cuda_graph" if self.device.type == "cuda" else "plain"
        if self.mode == "cuda_graph":
            check_optimizer(optimizer, params)
        self._graphs: Dict[tuple, _Captured] = {}
        self.captures = 0
        self.replays = 0

    def __call__(self, batch) -> torch.Tensor:
        if self.mode == "plain":
            check_model(self.model, batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model, batch)
            loss.backward()
            self.optimizer.step()
            return loss.detach()
        key = _shape_key(batch) + (self.model.training,)  # train() / eval(): another graph
        c = self._graphs.get(key)
        if c is None:
            c = self._capture(batch)
            self._graphs[key] = c
        for k, dst in c.inputs:
            dst.copy_(batch[k], non_blocking=True)
        c.graph.replay()
        self.replays += 1
        return c.loss.detach().clone()

    # ------------------------------------------------------------------ capture (CUDA)
    def _capture(self, batch) -> _Captured:
        model, opt, dev = self.model, self.optimizer, self.device
        check_model(model, batch)
        check_optimizer(opt, list(model.parameters()))
        static = copy.copy(batch)
        inputs = []
        for k, v in _tensors(batch):
            t = torch.empty_like(v, device=dev)
            t.copy_(v)
            static[k] = t
            inputs.append((k, t))
        snap = _Snapshot(model, opt)
        rng = torch.cuda.get_rng_state(dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        try:
            with torch.cuda.stream(side):
                for i in range(self.warmup):
                    opt.zero_grad(set_to_none=True)
                    loss = self.loss_fn(model, static)
                    loss.backward()
                    opt.step()
                    if i == 0 and not self.allow_random and not torch.equal(torch.cuda.get_rng_state(dev), rng):
                        raise ValueError("GraphedStep: the step draws random numbers (dropout?); its captured "
                                         "replays would not match the plain step. Put the random modules in eval "
                                         "mode, or pass allow_random=True (results then equal in distribution "
                                         "only)")
            torch.cuda.current_stream(dev).wait_stream(side)
        except BaseException:
            torch.cuda.current_stream(dev).wait_stream(side)
            snap.restore()
            torch.cuda.set_rng_state(rng, dev)
            raise
        snap.restore()
        torch.cuda.set_rng_state(rng, dev)
        torch.cuda.synchronize(dev)
        opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                loss = self.loss_fn(model, static)
                loss.backward()
                opt.step()
        except Exception as e:
            try:
                torch.cuda.synchronize(dev)
                snap.restore()
                opt.zero_grad(set_to_none=True)
            except Exception as e2:  # the device is in doubt: say so rather than hide the first error
                raise RuntimeError(f"GraphedStep: capturing the step failed ({type(e).__name__}: {e}), and "
                                   f"putting the model back failed too ({e2})") from e
            raise RuntimeError(f"GraphedStep: capturing the step failed ({type(e).__name__}: {e}). Usual cause: an "
                               "op that waits on the host (.item(), int(batch.max()) in a readout given no size=, "
                               "boolean masking, add_remaining_self_loops in GCNConv); the model and optimizer "
                               "are as before the warm-up") from e
        self.captures += 1
        return _Captured(graph, static, inputs, loss)
