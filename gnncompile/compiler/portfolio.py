"""The implementation portfolio of the fused ops: per op and device the candidate
implementations, which of them runs, and why.

Today one op has more than one candidate, the fused spmm (sum and mean, unweighted or one weight
per edge, float32 / float64; :data:`CANDIDATES`):

* ``native``: gnncompile's own kernel (``gnncompile::spmm``, native/cpu/spmm_core.h), with its
  knobs from the settings;
* ``torch_sparse``: the vendor library, ``torch.sparse.mm`` on a CSR tensor over the same
  structure (``gnncompile::spmm_sparse``, :mod:`gnncompile.ops.vendor`: MKL on the CPU,
  cuSPARSE on CUDA).

``Settings.choices['spmm_impl']`` picks: 'native', 'torch_sparse', or 'auto' (the default): the
faster of the two as measured on this device. The decision is made when a graph is compiled
(:func:`decide`, called by the rewrite through :mod:`gnncompile.passes.portfolio`) and baked into
the graph; :func:`gnncompile.explain` names the implementation of each fused spmm and why.

The measurement (:func:`measure`)
---------------------------------
One measurement per *class*: device, dtype, weighted or not, the feature width rounded up to a
power of two in [16, 256] (:func:`width_class`), and torch's thread count. At the first compile
that needs a class on a device, a synthetic graph of that class (random edges, mean degree 8,
about 2**21 gathered feature values, so every width moves about the same bytes) is built; both
candidates run its forward once and are compared; then they are timed, interleaved, each call
alone (:func:`time_candidate`), until :data:`REPEATS` rounds are done or :data:`BUDGET_S` (2 s)
has passed, whichever is first; the median of each is kept. A class measured in fewer than
:data:`MIN_ROUNDS` rounds (a busy machine) keeps ``native`` under 'auto'. The forward alone is timed: the
backward's gradient of x is the same candidate's spmm over the transposed structure.

The result goes to ``profile_dir()/portfolio/<device_key>.json`` (:func:`cache_path`, written
atomically), one entry per class, and is read from there by every later compile, in any process;
a file that cannot be read (bad JSON, wrong layout) gives a :class:`PortfolioWarning` and the
class is measured again (and the file rewritten). Deleting the file re-measures.

Exactness
---------
The compiler never changes what a model computes: a candidate runs only where it gives the
native kernel's bits. The measurement compares the forward output and the gradients of x (and of
the weight) of both candidates bitwise and records ``exact``. On the CPU here torch.sparse.mm
(MKL) sums each row in CSR order, as the native kernel does, and unweighted sums agree bitwise;
with weights, the native kernel's ``acc += w * x`` may be compiled to a fused multiply-add
(-march=native) where MKL rounds the product first, so they can differ in the last bit. A class
that is not exact keeps ``native``, whatever the choice ('auto' or 'torch_sparse'), unless
``Settings.reassociate`` is on (the setting that already allows results that differ in
rounding). On CUDA the vendor candidate is listed but not admitted: its agreement with the
native kernel has not been checked on a GPU, so ``native`` runs there and explain says so.
"""
from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from .. import profiles as _profiles
from ..hardware import device as _device
from ..ops import structure as _structure
from ..ops import targets, vendor

#: candidates per fused op and device type, in the order they are listed (the first is ours)
CANDIDATES: Dict[str, Dict[str, tuple]] = {
    "spmm": {"cpu": ("native", "torch_sparse"), "cuda": ("native", "torch_sparse")},
}
#: what each candidate is
DESCRIPTIONS = {"native": "gnncompile::spmm (native/cpu, native/cuda)",
                "torch_sparse": "torch.sparse.mm on a CSR tensor (MKL on the CPU, cuSPARSE on CUDA)"}
#: device types where the vendor candidate may run (CUDA: not yet checked on a GPU)
ADMITTED = ("cpu",)
BUDGET_S = 2.0
REPEATS = 15
#: a class measured in fewer rounds than this (the budget ran out: the machine was busy) keeps
#: ``native``: one or two interleaved calls under load say nothing (a file measured so on this
#: project's shared machine read native 484 ms against torch_sparse 116 ms for a 32k-edge spmm
#: that takes about 0.2 ms, and sent GIN's spmm to torch.sparse.mm, which runs about 100 ms a
#: call with 2 threads while other work holds a core)
MIN_ROUNDS = 3
FORMAT = "gnncompile-portfolio"
VERSION = 1


class PortfolioWarning(UserWarning):
    """The portfolio cache file could not be read: the classes it held are measured again."""


@dataclass(frozen=True)
class Decision:
    """The implementation a fused op runs (``impl``) and why."""

    impl: str
    why: str

    def __str__(self) -> str:
        return f"runs {self.impl} ({self.why})"


def width_class(width: int) -> int:
    """The feature width rounded up to a power of two, in [16, 256]."""
    w = max(int(width), 1)
    return min(256, max(16, 1 << (w - 1).bit_length()))


def class_key(dtype: torch.dtype, weighted: bool, width: int, threads: Optional[int] = None) -> str:
    t = torch.get_num_threads() if threads is None else threads
    return f"spmm/{'weighted' if weighted else 'plain'}/{str(dtype).replace('torch.', '')}/F{width_class(width)}/t{t}"


def device_key(device: torch.device) -> str:
    return _device.device_key(_device.detect(device))


def cache_path(key: str) -> Path:
    """``profile_dir()/portfolio/<device_key>.json``."""
    return _profiles.profile_dir() / "portfolio" / f"{key}.json"


def _valid_entry(e: Any) -> bool:
    if not isinstance(e, dict) or not isinstance(e.get("exact"), bool) or not isinstance(e.get("ms"), dict):
        return False
    return all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v) and v > 0 for k, v in e["ms"].items()) and len(e["ms"]) > 0


def load(key: str) -> Dict[str, dict]:
    """The measured classes of device ``key`` ({} when there is no file; a file that cannot be
    read gives a :class:`PortfolioWarning` and {})."""
    path = cache_path(key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        warnings.warn(f"gnncompile: cannot read the portfolio cache {path} ({e}); measuring again",
                      PortfolioWarning, stacklevel=2)
        return {}
    try:
        doc = json.loads(text)
        if not (isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == VERSION
                and isinstance(doc.get("classes"), dict)):
            raise ValueError("not a gnncompile portfolio file of version 1")
        bad = [k for k, e in doc["classes"].items() if not _valid_entry(e)]
        if bad:
            raise ValueError(f"ill-formed entries {bad[:3]}")
    except ValueError as e:
        warnings.warn(f"gnncompile: the portfolio cache {path} is corrupt ({e}); measuring again",
                      PortfolioWarning, stacklevel=2)
        return {}
    return dict(doc["classes"])


def save(key: str, classes: Dict[str, dict]) -> Path:
    """Writes the classes of device ``key`` atomically (:func:`gnncompile.profiles.atomic_write`)."""
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "version": VERSION, "device_key": key, "torch_version": torch.__version__,
           "classes": classes}
    _profiles.atomic_write(path, lambda f: f.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()))
    return path


# ----------------------------------------------------------------------------- the candidates
def run_candidate(impl: str, csr, csc, weight, x, reduce: str = "sum"):
    """One call of candidate ``impl`` (the output)."""
    if impl == "native":
        return targets.SPMM(*csr, weight, x, reduce, [], *csc)[0]
    if impl == "torch_sparse":
        return targets.SPMM_SPARSE(*csr, weight, x, reduce, [], *csc)
    raise ValueError(f"gnncompile portfolio: unknown candidate {impl!r}")


def time_candidate(impl: str, fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` (candidate ``impl``) takes (tests replace this to make one
    candidate faster)."""
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _inputs(device, dtype, weighted: bool, width: int):
    F = width_class(width)
    E = max(4096, (1 << 21) // F)
    N = max(64, E // 8)
    g = torch.Generator().manual_seed(20261203)
    ei = torch.randint(0, N, (2, E), generator=g).to(device)
    x = torch.randn(N, F, generator=g, dtype=dtype).to(device)
    w = torch.rand(E, generator=g, dtype=dtype).to(device) if weighted else None
    s = _structure.build(ei, N)
    return (s.rowptr, s.col, s.perm), s.transposed(N), w, x


def _exact(impls, csr, csc, w, x) -> bool:
    outs = {}
    for impl in impls:
        xr = x.detach().clone().requires_grad_()
        wr = None if w is None else w.detach().clone().requires_grad_()
        y = run_candidate(impl, csr, csc, wr, xr)
        g = torch.ones_like(y) / 3  # (a factor that rounds: the sums of the gradient are exercised)
        grads = torch.autograd.grad(y, [xr] + ([wr] if wr is not None else []), g)
        outs[impl] = [y.detach()] + [t.detach() for t in grads]
    first = outs[impls[0]]
    return all(all(torch.equal(a, b) for a, b in zip(first, outs[i])) for i in impls[1:])


def measure(device: torch.device, dtype: torch.dtype, weighted: bool, width: int,
            budget_s: float = BUDGET_S) -> dict:
    """Compares and times the spmm candidates on a synthetic graph of the class (module
    docstring); returns ``{"ms": {impl: median ms}, "exact": bool, "rounds": n, "F": width class,
    "E": edges}``."""
    impls = CANDIDATES["spmm"][device.type]
    start = time.perf_counter()
    with torch.no_grad():
        csr, csc, w, x = _inputs(device, dtype, weighted, width)
    exact = _exact(impls, csr, csc, w, x)
    times: Dict[str, list] = {i: [] for i in impls}
    with torch.no_grad():
        for i in impls:  # warm-up
            run_candidate(i, csr, csc, w, x)
        for r in range(REPEATS):
            order = impls if r % 2 == 0 else tuple(reversed(impls))
            for i in order:
                times[i].append(time_candidate(i, lambda i=i: run_candidate(i, csr, csc, w, x)))
            if time.perf_counter() - start > budget_s * 0.9:
                break
    return {"ms": {i: statistics.median(t) * 1e3 for i, t in times.items()}, "exact": exact,
            "rounds": len(times[impls[0]]), "F": width_class(width), "E": int(csr[1].numel())}


def decide(device: Any, dtype: torch.dtype, width: int, reduce: str = "sum", weight_dims: Optional[int] = None,
           setting: str = "auto", reassociate: bool = False) -> Decision:
    """The spmm implementation for one fused call (see the module docstring): x of ``dtype`` with
    ``width`` features per node, ``weight_dims`` None (no weight) or the weight's dimensions (1:
    one per edge; 2: per head); from the setting, the class's cached measurement, or a new
    measurement (written to the cache)."""
    device = torch.device(device)
    weighted = weight_dims is not None
    if setting not in ("auto", "native", "torch_sparse"):
        raise ValueError(f"gnncompile portfolio: spmm_impl must be 'auto', 'native' or 'torch_sparse', got {setting!r}")
    if setting == "native":
        return Decision("native", "choices['spmm_impl'] = 'native'")
    if not vendor.supports(reduce, dtype, weight_dims, dtype):
        what = f"a {reduce} of {str(dtype).replace('torch.', '')}" + (" with per-head weights" if weight_dims == 2 else "")
        return Decision("native", f"the only candidate for {what}")
    if device.type not in CANDIDATES["spmm"]:
        return Decision("native", f"no other candidate on {device.type}")
    if device.type not in ADMITTED:
        return Decision("native", f"torch_sparse not admitted on {device.type}: its agreement with the native "
                                  "kernel has not been checked on this device type")
    key, ck = device_key(device), class_key(dtype, weighted, width)
    classes = load(key)
    entry = classes.get(ck)
    fresh = entry is None
    if fresh:
        entry = measure(device, dtype, weighted, width)
        classes[ck] = entry
        save(key, classes)
    ms = entry["ms"]
    said = ", ".join(f"{i} {ms[i]:.3g} ms" for i in ms)
    where = f"{'measured now' if fresh else 'measured'} at F{entry.get('F', width_class(width))}: {said}"
    if not entry["exact"] and not reassociate:
        return Decision("native", f"torch_sparse differs from native in the last bits for this class ({where}); "
                                  "admitted only with reassociate")
    if setting == "torch_sparse":
        return Decision("torch_sparse", f"choices['spmm_impl'] = 'torch_sparse'; {where}")
    rounds = entry.get("rounds", REPEATS)  # (entries written before rounds were recorded: trusted)
    if isinstance(rounds, int) and rounds < MIN_ROUNDS:
        return Decision("native", f"measured in {rounds} round(s) only, under {MIN_ROUNDS} (the machine was busy; "
                                  f"delete {cache_path(key)} to measure again): ours kept; {where}")
    best = min(ms, key=lambda i: (ms[i], i != "native"))  # a tie keeps ours
    return Decision(best, f"fastest, {where}")


__all__ = ["CANDIDATES", "DESCRIPTIONS", "Decision", "decide", "measure", "load", "save", "cache_path",
           "class_key", "width_class", "time_candidate", "run_candidate", "PortfolioWarning", "BUDGET_S"]
