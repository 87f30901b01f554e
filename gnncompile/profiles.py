"""Device profiles: the settings a tuning run chose for one device and one workload.

A profile is a versioned JSON file::

    {
      "format": "gnncompile-profile", "schema_version": 1,
      "gnncompile_version": "0.1.0", "torch_version": "2.13.0",
      "created": "2026-...Z",
      "device_key": "cpu-amd-epyc-2c-avx512bf16-l2-1m-l3-32m",
      "device": {... gnncompile.hardware.detect() ...},
      "workload": {"kind": "graphs", "model": "gin", ...},
      "workload_signature": "graphs-gin-3f2a9c1d",
      "settings": {"knobs": [8], "threads": 2, "batch_size": 128, "pool_size": 4,
                   "num_workers": 1, "pin_memory": false, "persistent_workers": true,
                   "inner": "aot_eager"},
      "throughput": {"tuned": 5210.0, "default": 3900.0, "unit": "graphs/s", "speedup": 1.34},
      "study": {"name": ..., "storage": ..., "trials": ...}
    }

Files live in :func:`profile_dir` (``$GNNCOMPILE_CACHE_DIR/profiles``, else
``$XDG_CACHE_HOME/gnncompile/profiles``, else ``~/.cache/gnncompile/profiles``), named
``<device_key>__<workload_signature>.json``, and are written atomically (a temporary file in
the same folder, fsync, ``os.replace``): a crash leaves the old file or the new one, never half
of one.

Loading never crashes: a corrupt file (bad JSON, wrong format, missing or ill-typed settings),
a foreign one (another device key) or a stale one (another schema version, another gnncompile
version, another torch major.minor) gives a :class:`ProfileWarning` and the defaults of
:func:`gnncompile.hardware.default_settings`.

Every setting has a range (:func:`setting_ranges`, from this machine's CPU count; None always
means "unset, use the default"). A value of the wrong type, or below its range, makes the
profile corrupt (warning + defaults); a value above its range is clamped to the top of it, with
a ProfileWarning saying what was changed:

* ``threads``: ``[1, cpus]`` (cpus = the logical CPUs of this machine, the host's for a CUDA
  device): more threads than CPUs only oversubscribe the cores.
* ``num_workers``: ``[0, 2 * cpus]`` loader processes.
* ``pool_size``: ``[1, max(8, 2 * cpus + 2)]`` batch slots: one per worker at the most workers,
  one ready and one in use; every slot holds buffers for the largest batch, so slots beyond what
  can be in flight only hold memory.
* ``batch_size``: ``[1, 2**20]`` (:data:`MAX_BATCH_SIZE`; each pool slot holds
  ``batch_size + 1`` int64 pointers per batched attribute, at most 8 MiB).
* ``knobs``: a list of ints >= 0 (0 = the kernel's default), at most one per knob of the device
  (extra entries are dropped): on the CPU ``[chunks_per_thread, prefetch_distance,
  block_budget_kib]`` in ``[0, 4096]``, ``[0, 64]`` and ``[0, 2**22]`` (:data:`CPU_MAX_CHUNKS_PER_THREAD`,
  :data:`CPU_MAX_PREFETCH_DISTANCE`, :data:`CPU_MAX_BLOCK_BUDGET_KIB`, the kernels' own caps in
  native/cpu/glue.h; the third is the spmm's column-block budget, 0 = no blocking); on CUDA
  ``[lanes_per_row, rows_per_block, vec_width, items_per_group]`` up to
  :data:`gnncompile.hardware.cuda_knobs.EXPLICIT_KNOB_MAX` (``(32, 256, 16, 2**20)``), the bounds
  native/cuda/knobs.h applies to explicit knobs, read from the native extension (without it
  the CUDA knobs are only checked to be ints >= 0: no kernel reads them then).
* ``pin_memory``, ``persistent_workers``: true or false; ``inner``: one of
  :data:`gnncompile.compiler.backend.INNERS`; ``spmm_impl``: one of :data:`SPMM_IMPLS`, the fused
  spmm's implementation (``Settings.choices['spmm_impl']``, :mod:`gnncompile.compiler.portfolio`);
  ``precision``: one of :data:`PRECISIONS`, the precision the fused spmm gathers in
  (``Settings.choices['precision']``, :mod:`gnncompile.passes.precision`; 'bf16' is an opt-in
  lower precision, which the tuner searches only with ``--allow-bf16``).

Transfer. When no usable profile has this device's key, :func:`find` offers the profile of the
nearest other device (:func:`gnncompile.hardware.class_distance`: a CPU's only from a CPU, a
CUDA device's only from a CUDA device; ISA class, caches, vendor, cores; compute capability,
SMs, memory), the nearest workload among that device's profiles, then the newest file, with its
settings adapted to this machine (:func:`adapt_settings`: threads rescaled by the cores, loader
workers by the CPUs, then the ranges above) as a Profile with ``source == 'transfer'``.
:func:`resolve` uses it only when a **verdict** says it is not slower than this device's
defaults (:func:`gate`): a short interleaved A/B on the profile's own workload
(:mod:`gnncompile.transfer`), cached as JSON in ``cache_dir()/transfer/<this key>__<source
key>__<workload signature>.json`` (format ``gnncompile-transfer-verdict``; ``accepted``,
``ratio`` (the median of the rounds' ratios transferred / defaults), ``interval``, ``runs``,
``reason``, and ``judged``: the source's ``created`` and settings, the adapted settings, the
versions; a verdict judging something else is stale). ``$GNNCOMPILE_TRANSFER``: ``check``
(default: with no verdict, the check runs at first use in a child process bounded by
``$GNNCOMPILE_TRANSFER_CHECK_S``), ``cached`` (verdicts already cached only), ``off``. A
rejected or unchecked transfer gives the defaults with the ``transfer`` record saying why;
:attr:`Profile.label` (the compiled model's ``Settings.profile``) says which. Profiles of other
devices that cannot be read or are stale are passed over silently.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from . import __version__
from . import _log as _logmod
from . import config as _config
from .config import INNERS  # what settings.inner may hold (None: the default)
from .hardware import cuda_knobs as _cuda_knobs
from .hardware import device as _device

_log = _logmod.get_logger(__name__)

FORMAT = "gnncompile-profile"
SCHEMA_VERSION = 1
#: the format of a cached transfer verdict (section "Transfer" of the module docstring)
VERDICT_FORMAT = "gnncompile-transfer-verdict"
VERDICT_VERSION = 1
SETTING_KEYS = ("knobs", "threads", "batch_size", "pool_size", "num_workers", "pin_memory",
                "persistent_workers", "inner", "spmm_impl", "precision")
#: what settings.spmm_impl may hold besides null
SPMM_IMPLS = _config.SPMM_IMPLS
#: what settings.precision may hold besides null ('bf16' only where the tuner was allowed lower
#: precision: tune --allow-bf16)
PRECISIONS = _config.PRECISIONS


#: The CPU kernels' cap on knobs[0] (chunks per thread): kMaxChunksPerThread in native/cpu/glue.h.
CPU_MAX_CHUNKS_PER_THREAD = 4096
#: The CPU kernels' cap on knobs[1] (prefetch distance, edges): kMaxPrefetchDistance in native/cpu/glue.h.
CPU_MAX_PREFETCH_DISTANCE = 64
#: The CPU kernels' cap on knobs[2] (the spmm's column-block budget, KiB): kMaxBlockBudgetKiB in native/cpu/glue.h.
CPU_MAX_BLOCK_BUDGET_KIB = 1 << 22
#: The largest batch_size a profile may set.
MAX_BATCH_SIZE = 1 << 20
#: pool_size may always go up to this many slots, however few CPUs the machine has.
MIN_POOL_CAP = 8


class ProfileWarning(UserWarning):
    """A profile could not be used (gnncompile fell back to the defaults), or some of its
    settings were out of range and were clamped."""


class ProfileError(ValueError):
    """Raised by :func:`validate` (and turned into a warning by the loaders)."""


# ------------------------------------------------------------------------------ locations
def cache_dir() -> Path:
    """gnncompile's cache folder (:func:`gnncompile.config.cache_dir`): $GNNCOMPILE_CACHE_DIR,
    else $XDG_CACHE_HOME/gnncompile, else ~/.cache/gnncompile."""
    return _config.cache_dir()


def profile_dir() -> Path:
    return cache_dir() / "profiles"


# ------------------------------------------------------------------------------ workloads
def workload_signature(workload: Mapping[str, Any]) -> str:
    """``<kind>-<model>-<8 hex digits of the workload's canonical JSON>``."""
    blob = json.dumps(dict(workload), sort_keys=True, separators=(",", ":"), default=str)
    h = hashlib.sha1(blob.encode()).hexdigest()[:8]
    kind = str(workload.get("kind", "any"))
    model = str(workload.get("model", "any"))
    return f"{kind}-{model}-{h}"


def workload_distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """How far apart two workloads are: 100 for another kind, 10 for another model, plus
    ``|log2 x - log2 y|`` summed over the numeric fields both have (sizes, features, ...)."""
    d = 0.0
    if a.get("kind") and b.get("kind") and a["kind"] != b["kind"]:
        d += 100.0
    if a.get("model") and b.get("model") and a["model"] != b["model"]:
        d += 10.0
    for k, va in a.items():
        vb = b.get(k)
        if isinstance(va, bool) or isinstance(vb, bool):
            continue
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va > 0 and vb > 0:
            d += abs(math.log2(va) - math.log2(vb))
    return d


# ------------------------------------------------------------------------------ the object
@dataclass
class Profile:
    """A loaded (or default) profile. ``settings`` always holds every key of SETTING_KEYS."""

    settings: Dict[str, Any]
    device: Dict[str, Any]
    device_key: str
    workload: Dict[str, Any] = field(default_factory=dict)
    throughput: Dict[str, Any] = field(default_factory=dict)
    path: Optional[str] = None
    source: str = "default"  # 'file', 'transfer' (another device's profile, adapted) or 'default'
    raw: Dict[str, Any] = field(default_factory=dict)
    #: a transfer (module docstring, "Transfer"): ``from`` (the source's device key), ``path``,
    #: ``distance``, ``notes`` (what was adapted) and, once checked, ``verdict`` ('accepted',
    #: 'rejected' or 'unchecked'), ``ratio``, ``interval``, ``reason``; {} otherwise. A default
    #: profile keeps the record of a transfer that was rejected or not checked.
    transfer: Dict[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.source == "default"

    @property
    def transferred_from(self) -> Optional[str]:
        """The device key of the profile these settings were transferred from (None: not a
        transfer, or one that was not used)."""
        return self.transfer.get("from") if self.source == "transfer" else None

    @property
    def label(self) -> str:
        """Where the settings came from, for :attr:`gnncompile.settings.Settings.profile` and
        explain(): the file, "<file> (transferred from <key>, checked: ...)", "(defaults)", or
        "(defaults; transfer from <key> rejected/unchecked: <reason>)"."""
        t = self.transfer
        if self.source == "transfer":
            return f"{self.path} (transferred from {t.get('from')}, {_verdict_text(t)})"
        if self.source == "default":
            if t.get("from"):
                return f"(defaults; transfer from {t['from']} {t.get('verdict', 'unchecked')}: {t.get('reason', '')})"
            return "(defaults)"
        return self.path or "(given as a document)"

    @property
    def knobs(self) -> List[int]:
        return list(self.settings.get("knobs") or [])

    def loader_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments for :class:`gnncompile.data.PooledLoader` (those that are set)."""
        keys = ("batch_size", "pool_size", "num_workers", "pin_memory", "persistent_workers")
        return {k: self.settings[k] for k in keys if self.settings.get(k) is not None}

    @property
    def inner(self) -> Optional[str]:
        """The inner compiler the tuning run chose (None: gnncompile's default)."""
        return self.settings.get("inner")

    def summary(self) -> str:
        tp = self.throughput
        speed = ""
        if _is_number(tp.get("tuned")) and _is_number(tp.get("default")) and tp["tuned"] and tp["default"]:
            speed = f", tuned {tp['tuned']:.4g} vs default {tp['default']:.4g} {tp.get('unit', '')}"
        where = self.path or "(defaults)"
        return f"{self.device_key} {self.workload.get('kind', '-')}/{self.workload.get('model', '-')}{speed}: {where}"


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _verdict_text(t: Mapping[str, Any]) -> str:
    """'checked: 1.07x the defaults [0.98, 1.15]' or 'unchecked'."""
    if t.get("verdict") in ("accepted", "rejected") and _is_number(t.get("ratio")):
        iv = t.get("interval") or {}
        span = (f" [{iv['low']:.2f}, {iv['high']:.2f}]" if _is_number(iv.get("low")) and _is_number(iv.get("high"))
                else "")
        return f"checked: {t['ratio']:.2f}x the defaults{span}"
    return str(t.get("verdict") or "unchecked")


def default_profile(props: Optional[Dict[str, Any]] = None) -> Profile:
    p = _device.detect() if props is None else props
    return Profile(settings=_complete(_device.default_settings(p), p), device=p,
                   device_key=_device.device_key(p), source="default")


def _complete(settings: Mapping[str, Any], props: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = dict.fromkeys(SETTING_KEYS)  # (None: unset; spmm_impl, precision: no device default)
    out.update(_device.default_settings(dict(props)))
    out.update({k: v for k, v in settings.items() if k in SETTING_KEYS})
    return out


# ------------------------------------------------------------------------------ writing
def make(device_props: Mapping[str, Any], workload: Mapping[str, Any], settings: Mapping[str, Any],
         tuned: Optional[float] = None, default: Optional[float] = None, unit: str = "",
         study: Optional[Mapping[str, Any]] = None, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The JSON document of a profile."""
    tp: Dict[str, Any] = {"tuned": tuned, "default": default, "unit": unit}
    if tuned and default:
        tp["speedup"] = tuned / default
    doc = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "gnncompile_version": __version__,
        "torch_version": torch.__version__,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device_key": _device.device_key(dict(device_props)),
        "device": dict(device_props),
        "workload": dict(workload),
        "workload_signature": workload_signature(workload),
        "settings": {k: settings.get(k) for k in SETTING_KEYS},
        "throughput": tp,
        "study": dict(study or {}),
    }
    if extra:
        doc.update(extra)
    return doc


def file_mode() -> int:
    """The mode a newly created file gets under the current umask (0644 under umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def default_filename(doc: Mapping[str, Any]) -> str:
    return f"{doc['device_key']}__{doc['workload_signature']}.json"


def save(doc: Mapping[str, Any], path: Union[str, os.PathLike, None] = None) -> Path:
    """Writes a profile atomically. ``path``: a file, a folder (the default file name goes into
    it) or None (:func:`profile_dir`). Returns the file written."""
    validate(doc, check_device=False, check_versions=False)
    target = Path(path) if path is not None else profile_dir()
    if target.suffix != ".json":
        target = target / default_filename(doc)
    target.parent.mkdir(parents=True, exist_ok=True)

    def write(f):
        f.write((json.dumps(doc, indent=2, sort_keys=False) + "\n").encode())

    atomic_write(target, write)
    return target


def atomic_write(target: Path, write) -> None:
    """Writes ``target`` through a temporary file in its folder (``write(binary file)``, fsync,
    ``os.replace``): a crash, or another process writing the same file, leaves one whole file,
    never half of one. The file gets the umask's mode (mkstemp alone would make it 0600)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent))
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------------------------ ranges
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def machine_cpus(props: Optional[Mapping[str, Any]] = None) -> int:
    """Logical CPUs of the machine ``props`` describes (the host's for a CUDA device), else
    ``os.cpu_count()``."""
    for key in ("logical_cpus", "host_logical_cpus"):
        v = (props or {}).get(key)
        if _is_int(v) and v >= 1:
            return v
    return os.cpu_count() or 1


def setting_ranges(props: Optional[Mapping[str, Any]] = None) -> Dict[str, Tuple[int, int]]:
    """``{setting: (low, high)}`` for the integer settings on the machine ``props`` describes
    (default: this one by ``os.cpu_count()``); see the module docstring for why."""
    cpus = machine_cpus(props)
    return {"threads": (1, cpus), "num_workers": (0, 2 * cpus),
            "pool_size": (1, max(MIN_POOL_CAP, 2 * cpus + 2)), "batch_size": (1, MAX_BATCH_SIZE)}


def knob_ranges(device_type: str) -> Optional[List[Tuple[int, int]]]:
    """``(low, high)`` of each kernel knob of a device type; the list's length is the number
    of knobs the kernels read (a profile's extra entries are dropped). CUDA's come from the
    launch rule in the native extension; None when it is not loaded (no kernel reads the knobs
    then: every op runs its pure-torch reference), and the knobs are only checked to be ints
    >= 0."""
    if device_type == "cuda":
        if not _cuda_knobs.available():
            return None
        return [(0, hi) for hi in _cuda_knobs.EXPLICIT_KNOB_MAX]
    return [(0, CPU_MAX_CHUNKS_PER_THREAD), (0, CPU_MAX_PREFETCH_DISTANCE), (0, CPU_MAX_BLOCK_BUDGET_KIB)]


def _in_range(name: str, v: Any, lo: int, hi: Optional[int], notes: List[str]) -> int:
    """``v`` clamped to ``hi`` (noted); ProfileError unless it is an int >= ``lo``."""
    if not (_is_int(v) and v >= lo):
        raise ProfileError(f"corrupt: {name} must be an int >= {lo}, got {v!r}")
    if hi is not None and v > hi:
        notes.append(f"{name} = {v} is above its range [{lo}, {hi}] on this machine; clamped to {hi}")
        return hi
    return v


def check_settings(settings: Mapping[str, Any], props: Optional[Mapping[str, Any]] = None,
                   device_type: str = "cpu") -> Tuple[Dict[str, Any], List[str]]:
    """``settings`` with every value above its range clamped (see :func:`setting_ranges`,
    :func:`knob_ranges`) and a note for each change. Raises :class:`ProfileError` for a value
    of the wrong type or below its range. None means unset and is kept."""
    out, notes = dict(settings), []
    for key, (lo, hi) in setting_ranges(props).items():
        if out.get(key) is not None:
            out[key] = _in_range(f"settings.{key}", out[key], lo, hi, notes)
    knobs = out.get("knobs")
    if knobs is not None:
        if not isinstance(knobs, list):
            raise ProfileError(f"corrupt: settings.knobs must be a list of ints >= 0, got {knobs!r}")
        ranges = knob_ranges(device_type)
        if ranges is None:  # the bounds are unknown (see knob_ranges): every entry kept
            ranges = [(0, None)] * len(knobs)
        knobs = [_in_range(f"settings.knobs[{i}]", k, *(ranges[i] if i < len(ranges) else (0, None)), notes)
                 for i, k in enumerate(knobs)]
        if len(knobs) > len(ranges):
            notes.append(f"settings.knobs has {len(knobs)} entries, the {device_type} kernels read "
                         f"{len(ranges)}; dropped the rest")
        out["knobs"] = knobs[:len(ranges)]
    for k in ("pin_memory", "persistent_workers"):
        if out.get(k) is not None and not isinstance(out[k], bool):
            raise ProfileError(f"corrupt: settings.{k} must be true or false, got {out[k]!r}")
    if out.get("inner") is not None and out["inner"] not in INNERS:
        raise ProfileError(f"corrupt: settings.inner must be one of {INNERS} or null, got {out['inner']!r}")
    if out.get("spmm_impl") is not None and out["spmm_impl"] not in SPMM_IMPLS:
        raise ProfileError(f"corrupt: settings.spmm_impl must be one of {SPMM_IMPLS} or null, "
                           f"got {out['spmm_impl']!r}")
    if out.get("precision") is not None and out["precision"] not in PRECISIONS:
        raise ProfileError(f"corrupt: settings.precision must be one of {PRECISIONS} or null, "
                           f"got {out['precision']!r}")
    return out, notes


def _device_type(doc: Mapping[str, Any]) -> str:
    return str(doc["device"].get("type", "cpu"))


# ------------------------------------------------------------------------------ reading

def validate(doc: Any, device_props: Optional[Mapping[str, Any]] = None, check_device: bool = True,
             check_versions: bool = True) -> None:
    """Raises :class:`ProfileError` saying why ``doc`` cannot be used on this device."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ProfileError("corrupt: not a gnncompile profile (no 'format': 'gnncompile-profile')")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ProfileError(f"stale: schema version {doc.get('schema_version')!r}, this gnncompile "
                           f"reads {SCHEMA_VERSION}")
    s = doc.get("settings")
    if not isinstance(s, dict):
        raise ProfileError("corrupt: 'settings' is missing or not an object")
    if not isinstance(doc.get("device"), dict) or not isinstance(doc.get("device_key"), str):
        raise ProfileError("corrupt: 'device' / 'device_key' missing")
    check_settings(s, device_props, _device_type(doc))  # raises for what cannot be clamped
    for k in ("workload", "throughput"):
        if not isinstance(doc.get(k, {}), dict):
            raise ProfileError(f"corrupt: '{k}' is not an object")
    if check_versions:
        if doc.get("gnncompile_version") != __version__:
            raise ProfileError(f"stale: written by gnncompile {doc.get('gnncompile_version')!r}, "
                               f"this is {__version__}")
        mine = ".".join(torch.__version__.split("+")[0].split(".")[:2])
        theirs = ".".join(str(doc.get("torch_version", "")).split("+")[0].split(".")[:2])
        if mine != theirs:
            raise ProfileError(f"stale: written with torch {doc.get('torch_version')!r}, this is "
                               f"{torch.__version__}")
    if check_device:
        props = _device.detect() if device_props is None else dict(device_props)
        key = _device.device_key(props)
        if doc["device_key"] != key:
            raise ProfileError(f"foreign: profile for device {doc['device_key']!r}, this is {key!r}")


#: How deeply a profile's JSON may nest (a profile nests a few levels). json's decoder recurses once
#: per level: a deeper file ("[" * 100000) raised RecursionError, not a ProfileError.
MAX_JSON_DEPTH = 64
_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')  # a string (to its end), or a bracket


def _nesting_over(text: str, limit: int) -> bool:
    """Whether the brackets of JSON ``text`` (outside strings) nest deeper than ``limit``."""
    depth = 0
    for m in _JSON_NESTING.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif c in "]}":
            depth -= 1
    return False


def read(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """The JSON document of a profile file (raises ProfileError when it is not JSON, or nests
    deeper than :data:`MAX_JSON_DEPTH`). Every reader of profiles (list, find, load_file, the
    tuner, the demo) goes through here."""
    try:
        with open(path) as f:
            text = f.read()
        if _nesting_over(text, MAX_JSON_DEPTH):
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ProfileError(f"corrupt: cannot read {path}: {e}") from None


def _from_doc(doc: Dict[str, Any], path: Optional[str], props: Mapping[str, Any]) -> Profile:
    """The Profile of a validated document, its settings clamped to this machine's ranges (a
    ProfileWarning lists what was clamped)."""
    settings, notes = check_settings(doc["settings"], props, _device_type(doc))
    if notes:
        warnings.warn(f"gnncompile: profile {path or '(given as a dict)'}: " + "; ".join(notes),
                      ProfileWarning, stacklevel=3)
    return Profile(settings=_complete(settings, props), device=dict(doc["device"]),
                   device_key=doc["device_key"], workload=dict(doc.get("workload") or {}),
                   throughput=dict(doc.get("throughput") or {}), path=path, source="file", raw=doc)


def load_file(path: Union[str, os.PathLike], device_props: Optional[Mapping[str, Any]] = None) -> Profile:
    """The profile in ``path``, or the defaults (with a ProfileWarning) when it cannot be used."""
    props = _device.detect() if device_props is None else dict(device_props)
    try:
        doc = read(path)
        validate(doc, props)
        return _from_doc(doc, str(path), props)
    except ProfileError as e:
        warnings.warn(f"gnncompile: ignoring profile {path}: {e}; using the defaults",
                      ProfileWarning, stacklevel=2)
    except Exception as e:  # never crash on a profile
        warnings.warn(f"gnncompile: ignoring profile {path}: unexpected {type(e).__name__}: {e}; "
                      "using the defaults", ProfileWarning, stacklevel=2)
    return default_profile(props)


def list_profiles(directory: Union[str, os.PathLike, None] = None) -> List[Path]:
    d = Path(directory) if directory is not None else profile_dir()
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob("*.json") if not p.name.startswith("."))


def _workload_gap(workload: Optional[Mapping[str, Any]], doc: Mapping[str, Any]) -> float:
    """-1 for the exact signature, else :func:`workload_distance` (0 when no workload is asked)."""
    if workload is None:
        return 0.0
    if doc.get("workload_signature") == workload_signature(workload):
        return -1.0
    wl = doc.get("workload")
    return workload_distance(dict(workload), wl if isinstance(wl, dict) else {})


def find(workload: Optional[Mapping[str, Any]] = None, device_props: Optional[Mapping[str, Any]] = None,
         directory: Union[str, os.PathLike, None] = None, transfer: bool = True) -> Optional[Profile]:
    """The usable profile for this device whose workload is nearest to ``workload`` (an exact
    signature wins; ties go to the newest file). Unusable files are skipped with a warning.

    With no usable profile for this device key and ``transfer``, the nearest device class's
    profile (:func:`transfer_candidate`): a Profile with ``source == 'transfer'``, not yet
    checked (:func:`resolve` decides whether it is used)."""
    props = _device.detect() if device_props is None else dict(device_props)
    key = _device.device_key(props)
    best, best_d = None, None
    for path in list_profiles(directory):
        if not path.name.startswith(key + "__"):
            continue
        try:
            doc = read(path)
            validate(doc, props)
        except ProfileError as e:
            warnings.warn(f"gnncompile: skipping profile {path}: {e}", ProfileWarning, stacklevel=2)
            continue
        d = _workload_gap(workload, doc)
        mtime = path.stat().st_mtime
        if best is None or d < best_d[0] or (d == best_d[0] and mtime > best_d[1]):
            best, best_d = (doc, path), (d, mtime)
    if best is None:
        return transfer_candidate(workload, props, directory) if transfer else None
    return _from_doc(best[0], str(best[1]), props)


# ------------------------------------------------------------------------------ transfer
def _count(props: Mapping[str, Any], *keys: str) -> Optional[int]:
    for k in keys:
        v = props.get(k)
        if _is_int(v) and v >= 1:
            return v
    return None


def adapt_settings(settings: Mapping[str, Any], source_props: Mapping[str, Any],
                   props: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """Another device's profile settings made fit for this device (``props``); returns the
    settings and a note per change:

    * ``threads`` rescaled by the physical cores (this / source: a profile that used every core
      uses every core here; the host CPUs for a CUDA device), ``num_workers`` by the logical CPUs,
      ``pool_size`` keeps its slots beyond the workers (``pool - workers + new workers``);
      ``persistent_workers`` off without workers;
    * ``knobs`` kept only when the source is the same device type (their layout is per type;
      else the defaults'); extra entries dropped;
    * then every value clamped to this machine's ranges (:func:`check_settings`).

    Raises :class:`ProfileError` for settings :func:`check_settings` rejects."""
    out, notes = dict(settings), []
    dtype = str(props.get("type", "cpu"))
    if str(source_props.get("type", "cpu")) != dtype and out.get("knobs") is not None:
        notes.append(f"knobs {out['knobs']} are for {source_props.get('type')}; dropped (the defaults')")
        out["knobs"] = None
    src_cores = _count(source_props, "physical_cores", "logical_cpus", "host_logical_cpus")
    dst_cores = _count(props, "physical_cores", "logical_cpus", "host_logical_cpus")
    t = out.get("threads")
    if _is_int(t) and t >= 1 and src_cores and dst_cores and src_cores != dst_cores:
        new = max(1, round(t * dst_cores / src_cores))
        if new != t:
            notes.append(f"threads {t} of {src_cores} cores -> {new} of {dst_cores}")
            out["threads"] = new
    src_cpus = _count(source_props, "logical_cpus", "host_logical_cpus")
    dst_cpus = _count(props, "logical_cpus", "host_logical_cpus")
    w = out.get("num_workers")
    if _is_int(w) and w >= 0 and src_cpus and dst_cpus and src_cpus != dst_cpus:
        new = round(w * dst_cpus / src_cpus)
        if new != w:
            notes.append(f"num_workers {w} of {src_cpus} CPUs -> {new} of {dst_cpus}")
            out["num_workers"] = new
            pool = out.get("pool_size")
            if _is_int(pool) and pool >= 1:
                out["pool_size"] = max(1, pool - w + new)
                if out["pool_size"] != pool:
                    notes.append(f"pool_size {pool} -> {out['pool_size']} (as many slots beyond the workers)")
            if new == 0 and out.get("persistent_workers"):
                out["persistent_workers"] = False
    out, clamped = check_settings(out, props, dtype)
    return out, notes + clamped


def transfer_candidate(workload: Optional[Mapping[str, Any]] = None,
                       device_props: Optional[Mapping[str, Any]] = None,
                       directory: Union[str, os.PathLike, None] = None) -> Optional[Profile]:
    """The profile of the nearest other device class (:func:`gnncompile.hardware.class_distance`;
    another device type is never taken), among those the nearest workload (then the newest file),
    adapted to this device (:func:`adapt_settings`); None when there is none. Profiles of other
    devices that cannot be read, are stale (another gnncompile or torch version) or cannot be
    adapted are passed over without a warning (they were never meant for this device)."""
    props = _device.detect() if device_props is None else dict(device_props)
    key = _device.device_key(props)
    best = None
    for path in list_profiles(directory):
        if path.name.startswith(key + "__"):
            continue
        try:
            doc = read(path)
            if isinstance(doc, dict) and doc.get("device_key") == key:
                continue  # this device's own, under another name: find() deals with those
            prof = transfer_profile(doc, str(path), props)
        except ProfileError as e:
            _log.debug("transfer: passing over %s: %s", path, e)
            continue
        rank = (prof.transfer["distance"], _workload_gap(workload, doc), -path.stat().st_mtime)
        if best is None or rank < best[0]:
            best = (rank, prof)
    return None if best is None else best[1]


def transfer_profile(doc: Any, path: Optional[str], device_props: Optional[Mapping[str, Any]] = None) -> Profile:
    """Another device's profile document as a transfer candidate for this device (settings
    adapted, ``transfer`` recorded, verdict 'unchecked'). Raises :class:`ProfileError` when it
    cannot be: corrupt or stale, or a device of another type (:func:`class_distance` None)."""
    from .hardware import classes as _classes

    props = _device.detect() if device_props is None else dict(device_props)
    validate(doc, props, check_device=False)
    dist = _classes.class_distance(props, doc["device"])
    if dist is None:
        raise ProfileError(f"foreign: profile for a {doc['device'].get('type', '?')} device "
                           f"({doc['device_key']}), this is a {props.get('type', 'cpu')} device: never transferred")
    try:
        settings, notes = adapt_settings(doc["settings"], doc["device"], props)
    except ProfileError:
        raise
    except (TypeError, ValueError) as e:
        raise ProfileError(f"corrupt: cannot adapt its settings: {e}") from None
    return Profile(settings=_complete(settings, props), device=props, device_key=_device.device_key(props),
                   workload=dict(doc.get("workload") or {}), throughput=dict(doc.get("throughput") or {}),
                   path=path, source="transfer", raw=doc,
                   transfer={"from": doc["device_key"], "path": path, "distance": round(dist, 3),
                             "workload_signature": doc.get("workload_signature"), "notes": notes,
                             "verdict": "unchecked"})


# ------------------------------------------------------------------------------ transfer verdicts
# (gnncompile.transfer measures them; what resolve() needs to use them lives here)
def verdict_dir() -> Path:
    return cache_dir() / "transfer"


def verdict_path(candidate: Profile) -> Path:
    """Where the verdict on ``candidate`` (a transfer candidate) is cached."""
    t = candidate.transfer
    sig = t.get("workload_signature") or workload_signature(candidate.workload)
    return verdict_dir() / f"{candidate.device_key}__{t['from']}__{sig}.json"


def _torch_minor() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def judged(candidate: Profile) -> Dict[str, Any]:
    """What a verdict on ``candidate`` is about; a cached verdict with other values is stale."""
    raw = candidate.raw or {}
    return {"source_created": raw.get("created"), "source_settings": raw.get("settings"),
            "settings": {k: candidate.settings.get(k) for k in SETTING_KEYS},
            "gnncompile_version": __version__, "torch": _torch_minor()}


def read_verdict(candidate: Profile) -> Optional[Dict[str, Any]]:
    """The cached verdict on ``candidate``; None when there is none, it is stale (module
    docstring) or the file is corrupt (with a ProfileWarning: it is measured again)."""
    path = verdict_path(candidate)
    if not path.exists():
        return None
    try:
        doc = read(path)
        if not (isinstance(doc, dict) and doc.get("format") == VERDICT_FORMAT
                and doc.get("version") == VERDICT_VERSION and isinstance(doc.get("accepted"), bool)
                and isinstance(doc.get("judged"), dict) and isinstance(doc.get("reason"), str)):
            raise ProfileError("corrupt: not a transfer verdict")
        ratio = doc.get("ratio")
        if ratio is not None and not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool)):
            raise ProfileError("corrupt: 'ratio' is not a number")
    except ProfileError as e:
        warnings.warn(f"gnncompile: ignoring the transfer verdict {path}: {e}; checking again",
                      ProfileWarning, stacklevel=3)
        return None
    if doc["judged"] != json.loads(json.dumps(judged(candidate))):
        _log.info("transfer: the verdict %s is stale (the profile, its adaptation or the versions "
                  "changed); checking again", path)
        return None
    return doc


def write_verdict(candidate: Profile, verdict: Mapping[str, Any]) -> Path:
    path = verdict_path(candidate)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = (json.dumps(dict(verdict), indent=2) + "\n").encode()
    atomic_write(path, lambda f: f.write(blob))
    return path


def _verdict(candidate: Profile, accepted: bool, reason: str, **extra: Any) -> Dict[str, Any]:
    return {"format": VERDICT_FORMAT, "version": VERDICT_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device_key": candidate.device_key, "source_key": candidate.transfer["from"],
            "source_path": candidate.transfer.get("path"), "accepted": accepted, "reason": reason,
            "ratio": extra.pop("ratio", None), "judged": judged(candidate), **extra}


@contextlib.contextmanager
def _locked(candidate: Profile) -> Iterator[None]:
    """An exclusive lock on the verdict's ``.lock`` file (where fcntl exists)."""
    path = verdict_path(candidate).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_child(candidate: Profile, props: Mapping[str, Any], limit_s: float) -> Optional[Dict[str, Any]]:
    """Runs the check in a child process (``gnncompile profile check-transfer --source``),
    killed (its whole process group) after ``limit_s`` seconds; the verdict it cached, or one
    saying why there is none (cached too, unless another process cached one meanwhile)."""
    cmd = [sys.executable, "-m", "gnncompile.cli", "profile", "check-transfer", "--source",
           str(candidate.transfer["path"]), "--device", str(props.get("type", "cpu"))]
    env = _config.child_environment(GNNCOMPILE_TRANSFER="off")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=limit_s)
        last = ((err or b"").decode(errors="replace").strip().splitlines() or [""])[-1]
        why = None if proc.returncode == 0 else f"the check process failed (exit {proc.returncode}): {last}"
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        why = f"the check did not finish within {limit_s:g} s (GNNCOMPILE_TRANSFER_CHECK_S)"
    v = read_verdict(candidate)
    if v is not None:
        return v
    v = _verdict(candidate, False, why or "the check process wrote no verdict",
                 seconds=round(time.monotonic() - t0, 2))
    write_verdict(candidate, v)
    return v


def apply_verdict(candidate: Profile, verdict: Optional[Mapping[str, Any]],
          props: Mapping[str, Any], reason: Optional[str] = None) -> Profile:
    """The candidate when ``verdict`` accepts it, else the defaults with the transfer record
    (verdict 'rejected', or 'unchecked' with ``reason`` when there is no verdict)."""
    t = dict(candidate.transfer)
    if verdict is None:
        t.update(verdict="unchecked", reason=reason or "no verdict")
    else:
        t.update(verdict="accepted" if verdict["accepted"] else "rejected", reason=verdict["reason"],
                 ratio=verdict.get("ratio"), interval=verdict.get("interval"),
                 verdict_path=str(verdict_path(candidate)))
    if verdict is not None and verdict["accepted"]:
        return Profile(settings=candidate.settings, device=candidate.device,
                                 device_key=candidate.device_key, workload=candidate.workload,
                                 throughput=candidate.throughput, path=candidate.path, source="transfer",
                                 raw=candidate.raw, transfer=t)
    d = default_profile(dict(props))
    d.transfer = t
    return d


def gate(candidate: Profile, props: Mapping[str, Any], mode: Optional[str] = None) -> Profile:
    """What :func:`resolve` uses for a transfer candidate: per ``mode``
    (:data:`gnncompile.config.TRANSFER_MODES`; None: ``$GNNCOMPILE_TRANSFER``), the cached
    verdict, else the check run now in a child process ('check'), else the defaults."""
    cfg = _config.current()
    mode = cfg.transfer if mode is None else mode
    if mode not in _config.TRANSFER_MODES:
        raise ValueError(f"gnncompile: transfer check mode must be one of {_config.TRANSFER_MODES}, got {mode!r}")
    if mode == "off":
        return apply_verdict(candidate, None, props, "transfers are off (GNNCOMPILE_TRANSFER=off)")
    verdict = read_verdict(candidate)
    if verdict is None and mode == "check":
        _log.info("transfer: no verdict on %s from %s; checking it (at most %g s)", candidate.path,
                  candidate.transfer["from"], cfg.transfer_check_s)
        verdict = _run_child(candidate, props, cfg.transfer_check_s)
    if verdict is None:
        return apply_verdict(candidate, None, props, "not checked yet (GNNCOMPILE_TRANSFER=cached); run "
                                             "`gnncompile profile check-transfer`")
    out = apply_verdict(candidate, verdict, props)
    _log.info("transfer: %s", out.label)
    return out


def _checked(found: Profile, props: Mapping[str, Any], check: Optional[str]) -> Profile:
    """``found`` itself, or for a transfer candidate what its verdict says (:func:`gate`)."""
    return gate(found, props, mode=check) if found.source == "transfer" else found


def resolve(profile: Any = "auto", workload: Optional[Mapping[str, Any]] = None,
            device: Any = None, directory: Union[str, os.PathLike, None] = None,
            check: Optional[str] = None) -> Profile:
    """What ``compile(profile=...)`` uses: 'auto' (the nearest profile for the detected device,
    else the profile of the nearest device class when its check allows it, else the defaults),
    a path, a :class:`Profile`, a profile document (dict) or None (the defaults). Never raises
    for a bad profile: warns and returns the defaults.

    ``check``: what to do with a transfer candidate that has no cached verdict, one of
    :data:`gnncompile.config.TRANSFER_MODES` (None: ``$GNNCOMPILE_TRANSFER``, default 'check':
    run the short A/B now, :func:`gnncompile.transfer.gate`)."""
    try:
        props = _device.detect(device)
    except Exception as e:  # pragma: no cover - detection must not break compile
        warnings.warn(f"gnncompile: device detection failed ({e}); using CPU defaults", ProfileWarning)
        props = {"type": "cpu", "model": "unknown", "logical_cpus": os.cpu_count() or 1, "isa": []}
    if profile is None:
        return default_profile(props)
    if isinstance(profile, Profile):
        return profile
    if isinstance(profile, dict):
        try:
            validate(profile, props)
            return _from_doc(profile, None, props)
        except ProfileError as e:
            warnings.warn(f"gnncompile: ignoring the profile given: {e}; using the defaults",
                          ProfileWarning, stacklevel=2)
            return default_profile(props)
    if isinstance(profile, str) and profile == "auto":
        found = find(workload, props, directory)
        return _checked(found, props, check) if found is not None else default_profile(props)
    if isinstance(profile, (str, os.PathLike)):
        p = Path(profile)
        if p.is_dir():
            found = find(workload, props, p)
            if found is None:
                warnings.warn(f"gnncompile: no usable profile for {_device.device_key(props)} in {p}; "
                              "using the defaults", ProfileWarning, stacklevel=2)
                return default_profile(props)
            return _checked(found, props, check)
        return load_file(p, props)
    raise TypeError(f"gnncompile: profile must be 'auto', a path, a Profile, a dict or None; got "
                    f"{type(profile).__name__}")


__all__ = ["Profile", "ProfileWarning", "ProfileError", "cache_dir", "profile_dir", "make", "save",
           "read", "validate", "load_file", "find", "resolve", "transfer_candidate", "transfer_profile", "adapt_settings", "gate", "apply_verdict",
           "read_verdict", "write_verdict", "verdict_path", "verdict_dir", "list_profiles", "default_profile",
           "workload_signature", "workload_distance", "SCHEMA_VERSION", "SETTING_KEYS", "check_settings",
           "setting_ranges", "knob_ranges", "machine_cpus", "CPU_MAX_CHUNKS_PER_THREAD", "CPU_MAX_PREFETCH_DISTANCE",
           "CPU_MAX_BLOCK_BUDGET_KIB",
           "MAX_BATCH_SIZE",
           "MAX_JSON_DEPTH"]
