"""gnncompile's configuration: every environment variable it reads, read here and only here.

Each variable is parsed into a typed field of :class:`Config`; a value that does not parse is a
:class:`ConfigError` naming the variable and what it accepts (never a silent default).
:func:`current` reads the environment each time it is called (cheaply: the parsed result is
kept while the raw values stay the same), so a variable set before the first use counts.
What a compiled model uses is copied into its :class:`gnncompile.settings.Settings` when it is
compiled; changing a variable later does not change a model already compiled.

Tests override values without touching ``os.environ`` with :func:`override`::

    with config.override(structure_check="all"):
        ...

The README's table of variables is :func:`table`, checked by a test.
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union  # noqa: F401

#: the inner compilers gnncompile hands the rest of a graph to
INNERS = ("eager", "aot_eager", "inductor")
#: the structure check modes (see :func:`gnncompile.ops.structure.set_structure_check`)
CHECK_MODES = ("off", "cpu", "all")
_CHECK_WORDS = {"0": "off", "off": "off", "1": "cpu", "on": "cpu", "cpu": "cpu", "2": "all", "all": "all"}
_TRUE = ("1", "on", "true", "yes")
_FALSE = ("0", "off", "false", "no")


class ConfigError(ValueError):
    """An environment variable of gnncompile holds a value it cannot use."""


@dataclass(frozen=True)
class Config:
    """The parsed environment (see :data:`VARIABLES` for each field's variable)."""

    inner: Optional[str] = None
    capture_dynamic: Union[bool, str] = True  # True, False or 'outputs'
    slot_order: bool = True
    structure_check: str = "cpu"
    programs: str = "auto"
    guard: str = "time"
    huge_pages: str = "auto"
    buffer_cache: Union[str, int] = "auto"  # 'auto', 'off' or a cap in MiB
    cuda_unverified: str = ""
    spmm_impl: str = "auto"
    precision: str = "fp32"
    edge_encoder: str = "auto"
    codegen: str = "auto"
    cxx: Optional[str] = None  # None: c++ on the PATH
    codegen_cache_mb: float = 256.0
    transfer: str = "check"
    transfer_check_s: float = 120.0
    disable_native: bool = False
    cache_dir: Optional[Path] = None  # None: $XDG_CACHE_HOME/gnncompile, else ~/.cache/gnncompile
    xdg_cache_home: Optional[Path] = None


def _flag(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}")


def _capture(name: str, raw: str) -> Union[bool, str]:
    if raw.strip().lower() == "outputs":
        return "outputs"
    try:
        return _flag(name, raw)
    except ConfigError:
        raise ConfigError(f"{name}={raw!r}: expected one of {'/'.join(_TRUE)}, {'/'.join(_FALSE)} "
                          "or outputs") from None


def _inner(name: str, raw: str) -> Optional[str]:
    v = raw.strip()
    if v in ("", "auto"):
        return None
    if v not in INNERS:
        raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(INNERS)} (or unset / 'auto')")
    return v


PROGRAM_MODES = ("auto", "always", "never")
GUARD_MODES = ("time", "off")
HUGE_PAGE_MODES = ("auto", "off")
#: the block cache of freed large CPU allocations (gnncompile.hardware.memory): these, or a cap in MiB
BUFFER_CACHE_MODES = ("auto", "off")


def buffer_cache_value(name: str, value: Any, error: type = None) -> Union[str, int]:
    """Checks a block-cache setting (``$GNNCOMPILE_BUFFER_CACHE`` or ``choices['buffer_cache']``):
    'auto', 'off' or a cap in MiB, an int > 0 (or a string of its digits); returns it canonical
    ('auto', 'off' or the int). Raises ``error`` (default ConfigError) naming ``name`` otherwise."""
    error = error or ConfigError
    v = value.strip().lower() if isinstance(value, str) else value
    if v in BUFFER_CACHE_MODES:
        return v
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    raise error(f"{name}={value!r}: expected auto, off or a cap in MiB (an int > 0)")


def _buffer_cache(name: str, raw: str) -> Union[str, int]:
    return buffer_cache_value(name, raw.strip() or "auto")
SPMM_IMPLS = ("auto", "native", "torch_sparse")
#: the precision the fused spmm gathers float32 features in: fp32 (default, exact as written) or bf16
#: (opt-in: features cast to bfloat16 before the op, fp32 accumulation, output back in float32;
#: gnncompile.passes.precision)
PRECISIONS = ("fp32", "bf16")
#: a linear map of narrow edge features that only a message reads: computed per edge inside the
#: message kernels (inside, the default: no E x W tensor) or as written, before them (outside)
EDGE_ENCODER_MODES = ("auto", "inside", "outside")
#: what compile(profile='auto') does with the profile of the nearest tuned device when this one has
#: none (gnncompile.transfer): check it by a short A/B at first use, use only verdicts already
#: cached, or never transfer
TRANSFER_MODES = ("check", "cached", "off")
#: generated message kernels (gnncompile.codegen): auto (the default: a kernel generated and
#: compiled per program and op where a C++ compiler works) or off (the interpreter; 'interpreter'
#: says the same)
CODEGEN_MODES = ("off", "auto")


def _codegen(name: str, raw: str) -> str:
    v = raw.strip().lower()
    v = "off" if v == "interpreter" else v
    if v not in CODEGEN_MODES:
        raise ConfigError(f"{name}={raw!r}: expected one of off (interpreter), auto")
    return v


def _command(name: str, raw: str) -> Optional[str]:
    if "\0" in raw:
        raise ConfigError(f"{name}={raw!r}: a command cannot hold a NUL character")
    return raw.strip() or None


def _one_of(modes: Tuple[str, ...]) -> Callable[[str, str], str]:
    """A parser taking one of ``modes`` (any case; empty: the first, the default)."""
    def parse(name: str, raw: str) -> str:
        v = raw.strip().lower() or modes[0]
        if v not in modes:
            raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(modes)}")
        return v
    return parse


#: the fused attention ops whose CUDA kernels are off by default: the passes leave their chains
#: (edge_softmax + spmm, each with its load-balanced CUDA kernel) unfused on CUDA unless
#: $GNNCOMPILE_CUDA_UNVERIFIED (choices['cuda_unverified']) names them. The three kernels give one
#: warp to each destination row, so a hub row is one warp's serial work: on an H200 (2026-12-04,
#: power-law graph of 1M nodes / 10M edges, largest in-degree 133,319) GAT's training step with
#: gnncompile::attention took 1090 ms against 56 ms for the chain (and 172 ms eager); the GATv2
#: and TransformerConv kernels were checked against the CPU's there (tests/gpu) but not timed.
#: (The variable's name is from when none of these had run on a GPU.)
CUDA_UNVERIFIED_OPS = ("attention_v2", "attention_dot", "attention")


def cuda_unverified(name: str, raw: str) -> str:
    """The ops of :data:`CUDA_UNVERIFIED_OPS` named in ``raw`` (comma-separated; 'all'; 'none' or
    empty: none), as one comma-separated string in that tuple's order."""
    v = raw.strip().lower()
    if v in ("", "none"):
        return ""
    if v == "all":
        return ",".join(CUDA_UNVERIFIED_OPS)
    names = [w.strip() for w in v.split(",") if w.strip()]
    bad = [w for w in names if w not in CUDA_UNVERIFIED_OPS]
    if bad or not names:
        raise ConfigError(f"{name}={raw!r}: expected op names among {', '.join(CUDA_UNVERIFIED_OPS)} "
                          "(comma-separated), all or none")
    return ",".join(o for o in CUDA_UNVERIFIED_OPS if o in names)


def _positive(what: str) -> Callable[[str, str], float]:
    """A parser taking a finite number > 0 (``what`` names it in the error)."""
    def parse(name: str, raw: str) -> float:
        try:
            v = float(raw)
        except ValueError:
            v = float("nan")
        if not v > 0 or v == float("inf"):
            raise ConfigError(f"{name}={raw!r}: expected {what} > 0")
        return v
    return parse


_seconds = _positive("a number of seconds")
_megabytes = _positive("a size in MB")


def _check(name: str, raw: str) -> str:
    mode = _CHECK_WORDS.get(raw.strip().lower())
    if mode is None:
        raise ConfigError(f"{name}={raw!r}: expected 0/off, 1/on/cpu or 2/all")
    return mode


def _path(name: str, raw: str) -> Optional[Path]:
    if "\0" in raw:
        raise ConfigError(f"{name}={raw!r}: a path cannot hold a NUL character")
    return Path(raw).expanduser() if raw else None  # empty: unset


def _xdg(name: str, raw: str) -> Optional[Path]:
    # the XDG base directory rule: a relative value is invalid and is ignored
    return Path(raw) if raw and os.path.isabs(raw) else None


@dataclass(frozen=True)
class Variable:
    name: str
    field: str
    parse: Callable[[str, str], Any]
    accepts: str
    doc: str


#: Every environment variable gnncompile reads, in the README's order.
VARIABLES: Tuple[Variable, ...] = (
    Variable("GNNCOMPILE_INNER", "inner", _inner, "eager, aot_eager, inductor, auto (unset)",
             "the inner compiler for the graph around the fused ops when compile(inner='auto') "
             "and the profile names none; unset: chosen per graph piece by its size"),
    Variable("GNNCOMPILE_CAPTURE_DYNAMIC", "capture_dynamic", _capture, "1 (default) / 0 / outputs",
             "trace ops with data-dependent output sizes (edge_index[:, mask]) and sizes read "
             "from data (int(batch.max()) + 1 in pooling with no graph count) into the graph "
             "instead of breaking it there; outputs: the ops only. With 1, a compiled module whose "
             "capture ended a graph piece at a data-dependent guard in torch's attention compiles "
             "again as with outputs"),
    Variable("GNNCOMPILE_SLOT_ORDER", "slot_order", _flag, "1 (default) / 0",
             "recompute per-edge inputs in CSR order, and read large per-edge inputs of the graph "
             "(edge encoders' features) from a copy in CSR order cached with the structure "
             "(gnncompile.ops.slots; 0: read them through the permutation; for A/B measurements)"),
    Variable("GNNCOMPILE_PROGRAMS", "programs", _one_of(PROGRAM_MODES), "auto (default), always, never",
             "message programs (any elementwise message, run by generated kernels or the CPU "
             "interpreter): auto fuses them where a measured rule says they are faster (many edges, "
             "high degree), always / never everywhere / nowhere"),
    Variable("GNNCOMPILE_GUARD", "guard", _one_of(GUARD_MODES), "time (default), off",
             "the speed guard: each rewritten graph piece is timed against its unrewritten form "
             "on its first calls (per size class) and the faster one is kept; off: always the "
             "rewritten form"),
    Variable("GNNCOMPILE_HUGE_PAGES", "huge_pages", _one_of(HUGE_PAGE_MODES), "auto (default), off",
             "transparent huge pages for torch's CPU allocations of >= 2 MiB, turned on process-wide "
             "by compile() where the kernel's THP mode is madvise (gnncompile.hardware.memory); "
             "off: torch's CPU allocator is left as it is"),
    Variable("GNNCOMPILE_BUFFER_CACHE", "buffer_cache", _buffer_cache, "auto (default), off, MiB > 0",
             "a cache of freed CPU allocations of >= 256 KiB, reused for later ones of their size (a training "
             "step's large and node-sized tensors are then not mapped and faulted in again every step), turned on "
             "process-wide by compile() for a CPU model (gnncompile.hardware.memory); auto: at most 1/8 of "
             "the memory, 4 GiB, kept idle; a number: that cap in MiB; off: none"),
    Variable("GNNCOMPILE_SPMM_IMPL", "spmm_impl", _one_of(SPMM_IMPLS), "auto (default), native, torch_sparse",
             "the fused spmm's implementation: auto runs the faster of gnncompile's kernel and torch.sparse.mm "
             "on a CSR tensor, measured once per device and size class (at most 2 s, cached in the profile "
             "folder; a class the budget allowed under 3 rounds keeps gnncompile's kernel); either runs only where it gives the native kernel's bits (gnncompile.compiler.portfolio)"),
    Variable("GNNCOMPILE_PRECISION", "precision", _one_of(PRECISIONS), "fp32 (default), bf16",
             "bf16 (opt-in, lower precision): each fused sum / mean spmm on float32 CPU features gathers them "
             "in bfloat16 (cast once before the op, accumulated in float32 in the kernel, float32 out; "
             "relative error about 2^-8 per element); fp32: the graph as written "
             "(gnncompile.passes.precision)"),
    Variable("GNNCOMPILE_EDGE_ENCODER", "edge_encoder", _one_of(EDGE_ENCODER_MODES),
             "auto (default), inside, outside",
             "a linear map of edge features of width <= 32 that only a message program reads (GINE's "
             "lin(edge_attr)): inside computes it per edge inside the message kernels, so its E x W output "
             "is never stored (nor its E x W gradient: the backward accumulates the map's gradients over the "
             "edges, gnncompile::message_encoder_grad); outside computes it as written and the kernels read it; "
             "auto puts it inside where its products per edge cost less than that E x W tensor: where its input "
             "width D (times 4/3 where its input needs a gradient) is at most min(W, 40) / 2 (GINE's "
             "lin(edge_attr) inside, SchNet's filter outside), explain saying why not "
             "(gnncompile.passes.messages.encoder_inside)"),
    Variable("GNNCOMPILE_CODEGEN", "codegen", _codegen, "auto (default), off / interpreter",
             "the message ops of a message program on the CPU (message_reduce, and the backward's "
             "message_sum_multi / message_edges): auto generates a kernel per program and op, compiles it "
             "with the system C++ compiler at first use and caches it on disk (gnncompile.codegen; the "
             "interpreter, with one warning, where no compiler works); off runs the interpreter (the same "
             "numbers, bit for bit)"),
    Variable("GNNCOMPILE_CXX", "cxx", _command, "a compiler command (default c++)",
             "the C++ compiler of the generated message kernels"),
    Variable("GNNCOMPILE_CODEGEN_CACHE_MB", "codegen_cache_mb", _megabytes, "MB > 0 (default 256)",
             "the size bound of the generated kernels' disk cache (<cache folder>/kernels; the least "
             "recently used go first)"),
    Variable("GNNCOMPILE_CUDA_UNVERIFIED", "cuda_unverified", cuda_unverified,
             "attention_v2, attention_dot, attention (comma-separated), all, none (default)",
             "fuse these attention chains on CUDA too (GATv2's, TransformerConv's, GAT's): their CUDA "
             "kernels give one warp to each destination row, which made GAT's step 19x slower than the "
             "unfused chain on a power-law graph on an H200, so by default the chains stay there, "
             "edge_softmax + spmm (for checking or timing the kernels on a GPU, tests/gpu)"),
    Variable("GNNCOMPILE_TRANSFER", "transfer", _one_of(TRANSFER_MODES), "check (default), cached, off",
             "a device with no profile of its own and a profile of a device of its class: check "
             "that profile against the defaults by a short A/B at first use (cached per device, "
             "source and workload; the faster is used), use only verdicts already cached (else "
             "the defaults), or never transfer"),
    Variable("GNNCOMPILE_TRANSFER_CHECK_S", "transfer_check_s", _seconds, "seconds > 0 (default 120)",
             "the time the first-use A/B check of a transferred profile may take (a child process, "
             "killed past it; the defaults are used then and the timeout is cached as the verdict)"),
    Variable("GNNCOMPILE_STRUCTURE_CHECK", "structure_check", _check, "0/off, 1/cpu (default), 2/all",
             "when a structure found by the identity of its edge_index is confirmed by a "
             "content fingerprint"),
    Variable("GNNCOMPILE_DISABLE_NATIVE", "disable_native", _flag, "0 (default) / 1",
             "do not load the native kernels (every op runs its pure-torch reference); read at import"),
    Variable("GNNCOMPILE_CACHE_DIR", "cache_dir", _path, "a path",
             "gnncompile's cache folder (device profiles, tuning studies); default "
             "$XDG_CACHE_HOME/gnncompile, else ~/.cache/gnncompile"),
    Variable("XDG_CACHE_HOME", "xdg_cache_home", _xdg, "an absolute path (a relative one is ignored)",
             "the base of the default cache folder"),
)

_lock = threading.Lock()
_overrides: Dict[str, Any] = {}
_cached: Tuple[Any, Optional[Config]] = (None, None)


def _parse(raw: Tuple[Optional[str], ...]) -> Config:
    values = {}
    for var, value in zip(VARIABLES, raw):
        if value is not None and value.strip():  # set and not empty (empty = unset)
            values[var.field] = var.parse(var.name, value)
    return Config(**values)


def _environment_key() -> tuple:
    """The variables' raw values as the process environment holds them, to compare against the
    last call's: ``os.environ``'s own mapping read directly (bytes on POSIX; about 1 us for the
    twenty variables, against 17 us through ``os.environ.get``, which encodes each name and
    decodes each value: the message ops' backward reads the configuration at every call), or
    ``os.environ.get``'s strings where that mapping is not there (another Python)."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encode is None:
        return tuple(os.environ.get(v.name) for v in VARIABLES)
    global _ENCODED
    if _ENCODED is None or _ENCODED[0] is not encode:
        _ENCODED = (encode, tuple(encode(v.name) for v in VARIABLES))
    return tuple(map(data.get, _ENCODED[1]))


_ENCODED: Optional[Tuple[Any, tuple]] = None  # (os.environ.encodekey, the variables' names encoded)


def current() -> Config:
    """The configuration now: the environment, then :func:`override`'s values over it. Raises
    :class:`ConfigError` for a variable holding a value it cannot use."""
    global _cached
    key = (_environment_key(), tuple(sorted(_overrides.items(), key=lambda kv: kv[0])) if _overrides else ())
    cached_key, cfg = _cached
    if cfg is None or cached_key != key:
        cfg = _parse(tuple(os.environ.get(v.name) for v in VARIABLES))
        if _overrides:
            cfg = replace(cfg, **_overrides)
        _cached = (key, cfg)
    return cfg


_FIELDS = {f.name for f in fields(Config)}


@contextlib.contextmanager
def override(**values: Any) -> Iterator[Config]:
    """Within the block, :func:`current` gives ``values`` over the environment (for tests).
    Values are checked as the variable's parser checks them (strings are parsed)."""
    unknown = set(values) - _FIELDS
    if unknown:
        raise TypeError(f"gnncompile.config.override: unknown field(s) {sorted(unknown)}; "
                        f"the fields are {sorted(_FIELDS)}")
    by_field = {v.field: v for v in VARIABLES}
    parsed = {k: by_field[k].parse(by_field[k].name, v) if isinstance(v, str) else v
              for k, v in values.items()}
    with _lock:
        saved = dict(_overrides)
        _overrides.update(parsed)
    try:
        yield current()
    finally:
        with _lock:
            _overrides.clear()
            _overrides.update(saved)


def cache_dir() -> Path:
    """gnncompile's cache folder: $GNNCOMPILE_CACHE_DIR, else $XDG_CACHE_HOME/gnncompile,
    else ~/.cache/gnncompile."""
    cfg = current()
    if cfg.cache_dir is not None:
        return cfg.cache_dir
    base = cfg.xdg_cache_home if cfg.xdg_cache_home is not None else Path.home() / ".cache"
    return base / "gnncompile"


#: the variables a launcher (torchrun, torch.distributed.run) sets for each rank process, read by
#: :func:`launcher` (gnncompile does not set them; the README's table does not list them)
LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


@dataclass(frozen=True)
class Launch:
    """Where this process stands in a ``torchrun`` job (one process: world_size 1, rank 0).

    ``group_rank`` is the node's rank (torchrun's ``--node-rank``); ``run_id`` names the job
    (torchrun's run id, the rendezvous address and port and the restart count; '' for one
    process), so that two jobs, or two simulated nodes on one host, never mistake each other's
    files (torchrun without ``--standalone`` sets the run id 'none': the address tells them apart)."""
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    group_rank: int = 0
    run_id: str = ""


def launcher() -> Launch:
    """The launcher's variables of this process (:data:`LAUNCHER_VARIABLES`), checked: a value
    that is not a non-negative integer, or a rank outside its world, is a :class:`ConfigError`."""
    raw = {k: os.environ.get(k) for k in LAUNCHER_VARIABLES}

    def count(name: str, default: int) -> int:
        v = (raw[name] or "").strip()
        if not v:
            return default
        try:
            n = int(v)
        except ValueError:
            n = -1
        if n < 0:
            raise ConfigError(f"{name}={v!r}: the launcher's {name} must be an integer >= 0")
        return n

    L = Launch(world_size=max(count("WORLD_SIZE", 1), 1), rank=count("RANK", 0),
               local_rank=count("LOCAL_RANK", 0), local_world_size=max(count("LOCAL_WORLD_SIZE", 1), 1),
               group_rank=count("GROUP_RANK", 0),
               run_id="|".join(raw[k] or "" for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                       "TORCHELASTIC_RESTART_COUNT")).strip("|"))
    if L.rank >= L.world_size or L.local_rank >= L.local_world_size:
        raise ConfigError(f"RANK={L.rank} / WORLD_SIZE={L.world_size}, LOCAL_RANK={L.local_rank} / "
                          f"LOCAL_WORLD_SIZE={L.local_world_size}: a rank must be below its world size")
    return L


def child_environment(**overrides: str) -> Dict[str, str]:
    """This process's environment with ``overrides``: what a child process gnncompile starts
    (a rank of a data-parallel tuning trial) is given."""
    env = dict(os.environ)
    env.update(overrides)
    return env


def table() -> str:
    """The markdown table of :data:`VARIABLES` (the README holds it)."""
    lines = ["| variable | values | what it sets |", "|---|---|---|"]
    lines += [f"| `{v.name}` | {v.accepts} | {v.doc} |" for v in VARIABLES]
    return "\n".join(lines)


__all__ = ["Config", "ConfigError", "VARIABLES", "current", "override", "cache_dir", "table",
           "Launch", "LAUNCHER_VARIABLES", "launcher", "child_environment",
           "INNERS", "CHECK_MODES", "PROGRAM_MODES", "GUARD_MODES", "SPMM_IMPLS", "PRECISIONS", "EDGE_ENCODER_MODES",
           "HUGE_PAGE_MODES", "BUFFER_CACHE_MODES", "buffer_cache_value", "TRANSFER_MODES", "CODEGEN_MODES"]
