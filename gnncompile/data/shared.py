"""One graph per host for data-parallel training: :func:`shared_graph`.

With DDP every rank is a process, and each would load (and hold) its own copy of the graph and
build its own copy of the neighbor sampler's CSC. ``shared_graph(key, build)`` makes it one
copy per host:

* Local rank 0 (``LOCAL_RANK``, as torchrun sets it) calls ``build()``, and writes every tensor
  of the graph, and the sampler's CSC of its ``edge_index`` (built and validated once), into
  files in ``/dev/shm`` (the temporary directory where there is none), the manifest last.
  It then maps those files itself and drops what ``build()`` returned.
* The other local ranks wait for the manifest and map the same files
  (``torch.from_file(..., shared=True)``: ``MAP_SHARED``, one physical copy per host).
* A :class:`NeighborSampler` / :class:`NeighborLoader` over the returned graph uses the mapped
  CSC (``sampler.shared_csc`` is True) instead of building one.
* The files are unlinked as soon as every local rank has mapped them (the mappings stay valid),
  or when local rank 0 exits, whichever comes first. If ``build()`` fails, the other ranks raise
  with its message instead of waiting (local rank 0 re-raises once they have seen it, or after
  at most a minute).

**The returned tensors are shared**: read-only by convention. An in-place write (``x.mul_()``,
a transform that edits ``data.x``) changes every rank's graph on the host. Copy a tensor before
changing it (``data.x = data.x.clone()``; the sampler then still uses the shared CSC, which
belongs to the ``edge_index`` tensor: replacing or editing ``edge_index`` makes the sampler
build its own).

Which ranks share: those with the same host-local group, told by torchrun's ``GROUP_RANK``
(0 when unset) and the run (``TORCHELASTIC_RUN_ID``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RESTART_COUNT``), so two simulated machines on one host (``--nnodes=2`` on
loopback) each build their own. The files record the process that wrote them: files whose
writer is gone (a crashed earlier run of the same name) are never read, and are replaced.
The ranks of one host must see each other's process ids (one PID namespace). Every local rank
must call ``shared_graph`` with the same keys in the same order.

Without ``LOCAL_WORLD_SIZE`` (or with 1) ``shared_graph`` just returns ``build()``.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..config import ConfigError, launcher
from ..ops import structure as _structure
from . import neighbor as _neighbor

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data, HeteroData

_FORMAT = 1
_lock = threading.Lock()
_calls: Dict[str, int] = {}  # key -> shared_graph calls in this process (the generation)
_stats = {"graph_builds": 0, "csc_builds": 0, "mapped": 0}


@dataclass(frozen=True)
class SharedInfo:
    """How :func:`shared_graph` got a graph: ``role`` is ``"built"`` (this process called
    ``build()`` and wrote the files), ``"mapped"`` (it mapped another's) or ``"single"`` (one
    local process: just ``build()``). ``path``: the files' directory (gone once every local rank
    has mapped them); ``nbytes``: the bytes mapped (tensors and CSC)."""

    key: str
    role: str
    local_rank: int
    local_world_size: int
    group_rank: int
    path: Optional[str] = None
    nbytes: int = 0


def stats() -> dict:
    """Counts in this process: ``graph_builds`` (``build()`` calls), ``csc_builds`` (sampler
    CSCs built for the shared files) and ``mapped`` (graphs mapped from another rank's files)."""
    return dict(_stats)


# ----------------------------------------------------------------------------- where, who
def _base_dir() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def _dir_name(key: str, group_rank: int, generation: int) -> str:
    import hashlib

    run = launcher().run_id
    digest = hashlib.sha256(json.dumps([key, group_rank, generation, run]).encode()).hexdigest()[:20]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:40]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return f"gnncompile-{uid}-{readable}-{digest}"


def _start_time(pid: int) -> Optional[str]:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22): with the pid,
    it names the process (pids are reused). None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


def _me() -> dict:
    pid = os.getpid()
    return {"pid": pid, "start": _start_time(pid)}


def _alive(owner: Any) -> bool:
    """Whether the process an owner record names still runs."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return False
    if owner.get("start") is None or not os.path.isdir("/proc"):
        try:
            os.kill(owner["pid"], 0)
            return True
        except PermissionError:
            return True
        except OSError:
            return False
    return _start_time(owner["pid"]) == owner["start"]


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, obj: Any) -> None:
    """Atomically: readers see the whole file or none."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _touch(path: str) -> None:
    with open(path, "w"):
        pass


def _remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


_owned: List[str] = []  # directories this process wrote and removes at exit


def _remove_owned(pid: int) -> None:
    if os.getpid() != pid:  # a forked child (a DataLoader worker) leaves them to its parent
        return
    for path in list(_owned):
        _remove(path)


atexit.register(_remove_owned, os.getpid())


def release_files() -> None:
    """Removes the shared-memory files this process wrote now (mappings stay valid), as its exit
    would: for a process that ends with ``os._exit``, which runs no exit handler."""
    _remove_owned(os.getpid())


# ----------------------------------------------------------------------------- tensors <-> files
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"shared_graph: unknown dtype {name!r} in the manifest")
    return dt


def _map(path: str, dtype: torch.dtype, shape: List[int], create: bool) -> Tensor:
    """The file as a tensor, mapped MAP_SHARED. ``create``: a new file of that size (zeros).
    An existing file is opened first and mapped through its descriptor, so a file unlinked
    meanwhile is never created anew by ``torch.from_file``."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if create:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    else:
        fd = os.open(path, os.O_RDONLY)
    try:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if create:
            os.ftruncate(fd, nbytes)
        elif os.fstat(fd).st_size != nbytes:
            raise RuntimeError(f"shared_graph: {path} holds {os.fstat(fd).st_size} bytes, the manifest says {nbytes}")
        via = f"/proc/self/fd/{fd}"
        t = torch.from_file(via if os.path.exists(via) else path, shared=True, size=numel, dtype=dtype)
    finally:
        os.close(fd)
    return t.view(shape)


def _stores(data: Any) -> List[Tuple[Any, Any]]:
    """(store key for the manifest, store) of a Data (one, key None) or HeteroData."""
    if isinstance(data, HeteroData):
        out = [(None, data._global_store)]
        out += [(t, data[t]) for t in data.node_types]
        out += [(list(et), data[et]) for et in data.edge_types]
        return out
    return [(None, data._store)]


def _plain(value: Any, where: str) -> Any:
    try:
        if json.loads(json.dumps(value)) == value:
            return value
    except (TypeError, ValueError):
        pass
    raise TypeError(f"shared_graph: {where} is a {type(value).__name__}; the shared graph holds tensors and "
                    "JSON values (int, float, str, bool, None, lists and dicts of them)")


def _write_graph(data: Any, path: str) -> Tuple[dict, Any, int]:
    """Writes data's tensors and the sampler CSC(s) under ``path``: (manifest, the graph rebuilt
    from the mapped files, bytes written)."""
    hetero = isinstance(data, HeteroData)
    entries, nbytes, i = [], 0, 0
    for skey, store in _stores(data):
        for attr, value in store.items():
            where = f"the attribute {attr!r}" + ("" if skey is None else f" of {skey!r}")
            if isinstance(value, Tensor):
                if value.is_sparse or value.layout != torch.strided:
                    raise TypeError(f"shared_graph: {where} is a sparse tensor; give dense tensors")
                if value.device.type != "cpu":
                    raise ValueError(f"shared_graph: {where} is on {value.device}; build() must return CPU tensors")
                if value.requires_grad:
                    value = value.detach()
                shape = list(value.shape)
                file = f"t{i}.bin" if value.numel() else None
                i += 1
                entries.append({"store": skey, "attr": attr, "file": file, "dtype": _dtype_name(value.dtype),
                                "shape": shape})
                t = _map(os.path.join(path, file), value.dtype, shape, create=True) if file else None
                if t is not None:
                    t.copy_(value.as_subclass(Tensor))
                    nbytes += t.numel() * t.element_size()
            else:
                entries.append({"store": skey, "attr": attr, "value": _plain(value, where)})
    manifest = {"format": _FORMAT, "hetero": hetero, "entries": entries, "csc": []}
    out = _read_graph(manifest, path)  # the writer's graph: the mapped files too
    # The sampler's CSC of each edge_index: built and validated here, once per host.
    for et, ei, n_dst, n_src in _edge_indices(out):
        ei_long = _neighbor._check_edge_index(ei, "the graph" if et is None else f"edge type {et}")
        with _structure.outside_inference_mode():
            st = _structure.build(ei_long, n_dst)
        try:
            st.check_sources(n_src)
        except IndexError as e:
            raise IndexError(e if et is None else f"edge type {et}: {e}") from None
        _stats["csc_builds"] += 1
        E = st.col.numel()
        k = len(manifest["csc"])
        rec = {"edge_type": None if et is None else list(et), "num_dst": n_dst, "num_src": n_src}
        colptr = _map(os.path.join(path, f"c{k}_colptr.bin"), torch.int64, [n_dst + 1], create=True)
        _neighbor._advise_huge_pages(colptr)
        colptr.copy_(st.rowptr)
        rec["colptr"] = {"file": f"c{k}_colptr.bin", "dtype": "int64", "shape": [n_dst + 1]}
        nbytes += colptr.numel() * 8
        if _neighbor._fits_pairs(max(n_dst, n_src), E):
            pairs = _map(os.path.join(path, f"c{k}_pairs.bin"), torch.int32, [E, 2], create=True)
            _neighbor._advise_huge_pages(pairs)
            if E:
                pairs[:, 0].copy_(st.col)
                pairs[:, 1].copy_(st.perm)
            rec["row"] = {"file": f"c{k}_pairs.bin" if E else None, "dtype": "int32", "shape": [E, 2]}
            rec["perm"] = None
            nbytes += E * 8
        else:  # pragma: no cover - graphs beyond int32
            for name, t in (("row", st.col), ("perm", st.perm)):
                m = _map(os.path.join(path, f"c{k}_{name}.bin"), torch.int64, [E], create=True)
                m.copy_(t)
                rec[name] = {"file": f"c{k}_{name}.bin" if E else None, "dtype": "int64", "shape": [E]}
                nbytes += E * 8
        del st
        manifest["csc"].append(rec)
    _attach_csc(out, manifest, path)
    return manifest, out, nbytes


def _edge_indices(data: Any):
    """(edge type or None, edge_index, num_dst, num_src) of each edge_index to build a CSC for."""
    if isinstance(data, HeteroData):
        for et in data.edge_types:
            ei = data[et].get("edge_index")
            n_src, n_dst = data[et[0]].num_nodes, data[et[2]].num_nodes
            if isinstance(ei, Tensor) and n_src is not None and n_dst is not None:
                yield tuple(et), ei, int(n_dst), int(n_src)
        return
    ei = data.get("edge_index")
    if isinstance(ei, Tensor) and data.num_nodes is not None:
        yield None, ei, int(data.num_nodes), int(data.num_nodes)


def _read_graph(manifest: dict, path: str) -> Any:
    """The graph of a manifest, its tensors mapped from the files under ``path``."""
    data = HeteroData() if manifest["hetero"] else Data()
    for e in manifest["entries"]:
        if "value" in e:
            value = e["value"]
        else:
            value = (_map(os.path.join(path, e["file"]), _dtype(e["dtype"]), e["shape"], create=False)
                     if e["file"] else torch.empty(e["shape"], dtype=_dtype(e["dtype"])))
        skey = e["store"]
        if skey is None:
            store = data._global_store if manifest["hetero"] else data._store
        else:
            store = data[skey if isinstance(skey, str) else tuple(skey)]
        store[e["attr"]] = value
    return data


def _tensor_of(rec: Optional[dict], path: str) -> Optional[Tensor]:
    if rec is None:
        return None
    if rec["file"] is None:
        return torch.empty(rec["shape"], dtype=_dtype(rec["dtype"]))
    return _map(os.path.join(path, rec["file"]), _dtype(rec["dtype"]), rec["shape"], create=False)


def _attach_csc(data: Any, manifest: dict, path: str) -> None:
    """Gives the graph the mapped sampler CSC(s), for NeighborSampler to find."""
    found: Dict[Any, Any] = {}
    for rec in manifest["csc"]:
        et = None if rec["edge_type"] is None else tuple(rec["edge_type"])
        ei = data.edge_index if et is None else data[et].edge_index
        found[et] = _neighbor._SharedCsc(ei, rec["num_dst"], rec["num_src"], _tensor_of(rec["colptr"], path),
                                          _tensor_of(rec["row"], path), _tensor_of(rec["perm"], path))
    if found:
        object.__setattr__(data, _neighbor._SHARED_CSC_ATTR, found if manifest["hetero"] else found[None])


def _nbytes(manifest: dict) -> int:
    n = 0
    recs = [e for e in manifest["entries"] if "value" not in e]
    recs += [r for c in manifest["csc"] for r in (c["colptr"], c["row"], c["perm"]) if r is not None]
    for r in recs:
        k = 1
        for s in r["shape"]:
            k *= int(s)
        n += k * torch.empty((), dtype=_dtype(r["dtype"])).element_size()
    return n


def _with_info(data: Any, info: SharedInfo) -> Any:
    object.__setattr__(data, "shared_info", info)
    return data


# ----------------------------------------------------------------------------- the two roles
def _build_and_write(key: str, build: Callable[[], Any], path: str, info: dict, timeout: float) -> Any:
    owner = _me()
    old = _read_json(os.path.join(path, "owner.json"))
    if os.path.lexists(path):
        if old is not None and _alive(old) and old.get("pid") != owner["pid"]:
            raise RuntimeError(f"shared_graph({key!r}): {path} belongs to the running process {old.get('pid')}; "
                               "is another run with the same run id (TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT) "
                               "on this host?")
        _remove(path)  # a stale run's (its writer is gone)
    os.mkdir(path, 0o700)
    _owned.append(path)
    _write_json(os.path.join(path, "owner.json"), owner)
    try:
        data = build()
        _stats["graph_builds"] += 1
        if not isinstance(data, (Data, HeteroData)):
            raise TypeError(f"shared_graph: build() must return a torch_geometric Data or HeteroData, "
                            f"got {type(data).__name__}")
        manifest, out, nbytes = _write_graph(data, path)
        del data
        manifest.update(key=key, owner=owner, nbytes=nbytes)
        _write_json(os.path.join(path, "manifest.json"), manifest)
    except BaseException as e:
        _write_json(os.path.join(path, "error.json"),
                    {"key": key, "owner": owner, "error": f"{type(e).__name__}: {e}"})
        _await_readers(path, "seen", info["local_world_size"] - 1, min(timeout, 60.0))
        _remove(path)
        raise
    return _with_info(out, SharedInfo(key, "built", path=path, nbytes=nbytes, **info))


def _await_readers(path: str, what: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _count(path, what) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def _count(path: str, what: str) -> int:
    try:
        return sum(1 for f in os.listdir(path) if f.startswith(what + "."))
    except OSError:
        return 0


def _wait_and_map(key: str, path: str, info: dict, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    delay, stale = 0.005, False
    lr = info["local_rank"]
    while True:
        err = _read_json(os.path.join(path, "error.json"))
        if err is not None and err.get("key") == key and _alive(err.get("owner")):
            try:
                _touch(os.path.join(path, f"seen.{lr}"))
            except OSError:
                pass
            raise RuntimeError(f"shared_graph({key!r}): build() failed on local rank 0 "
                               f"(pid {err['owner'].get('pid')}): {err.get('error')}")
        manifest = _read_json(os.path.join(path, "manifest.json"))
        if manifest is not None:
            if manifest.get("key") == key and manifest.get("format") == _FORMAT and _alive(manifest.get("owner")):
                try:
                    data = _read_graph(manifest, path)
                    _attach_csc(data, manifest, path)
                except FileNotFoundError as e:
                    raise RuntimeError(f"shared_graph({key!r}): the shared files went away while local rank {lr} "
                                       f"mapped them ({e}); did local rank 0 exit?") from None
                _stats["mapped"] += 1
                _touch(os.path.join(path, f"attached.{lr}"))
                if _count(path, "attached") >= info["local_world_size"] - 1:
                    _remove(path)  # every local rank has it mapped: the mappings outlive the files
                return _with_info(data, SharedInfo(key, "mapped", path=path, nbytes=_nbytes(manifest), **info))
            stale = True
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(
                f"shared_graph({key!r}): local rank {lr} waited {timeout:g} s for local rank 0 (GROUP_RANK "
                f"{info['group_rank']}) to build the graph and write {os.path.join(path, 'manifest.json')}"
                + ("; the files there are a stale run's (their writer is gone)" if stale else "")
                + ". Does local rank 0 call shared_graph with the same key (and is it still running: it removes "
                "the files when it exits), and is LOCAL_WORLD_SIZE right?")
        time.sleep(min(delay, deadline - now))
        delay = min(delay * 2, 0.05)


def shared_graph(key: str, build: Callable[[], Any], *, timeout: float = 600.0) -> Any:
    """The graph ``build()`` returns, held once per host: local rank 0 builds it and the other
    local ranks map its tensors, and the neighbor sampler's CSC, from shared memory (see the
    module docstring). ``key`` names the graph (same on every rank); ``timeout``: seconds the
    other ranks wait for local rank 0 before a :class:`TimeoutError`.

    Returns a ``Data`` (or ``HeteroData``) whose tensors are shared with the other local ranks:
    read-only by convention (an in-place write is seen by every rank on the host). Its
    ``shared_info`` (:class:`SharedInfo`) tells whether this process built or mapped it.
    Every tensor attribute must be a dense CPU tensor, every other attribute a JSON value."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"shared_graph: key must be a non-empty string, got {key!r}")
    if not callable(build):
        raise TypeError("shared_graph: build must be a function that returns the graph")
    try:
        launch = launcher()
    except ConfigError as e:
        raise ValueError(f"shared_graph: {e}") from None
    local_rank, local_world_size, group_rank = launch.local_rank, launch.local_world_size, launch.group_rank
    info = {"local_rank": local_rank, "local_world_size": local_world_size, "group_rank": group_rank}
    if local_world_size <= 1:
        data = build()
        _stats["graph_builds"] += 1
        if isinstance(data, (Data, HeteroData)):
            _with_info(data, SharedInfo(key, "single", **info))
        return data
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"shared_graph: LOCAL_RANK={local_rank} is out of range for "
                         f"LOCAL_WORLD_SIZE={local_world_size}")
    with _lock:
        generation = _calls[key] = _calls.get(key, 0) + 1
    path = os.path.join(_base_dir(), _dir_name(key, group_rank, generation))
    if local_rank == 0:
        return _build_and_write(key, build, path, info, timeout)
    return _wait_and_map(key, path, info, timeout)


__all__ = ["shared_graph", "SharedInfo", "stats"]
