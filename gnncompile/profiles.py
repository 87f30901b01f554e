"""Device profiles: the settings a tuning run chose for one device and one workload.

A profile is a versioned JSON file::

    {
      "format": "gnncompile-profile", "schema_version": 1,
      "gnncompile_version": "0.1.0", "torch_version": "2.13.0",
      "created": "2026-...Z",
      "device_key": "cpu-amd-epyc-2c-avx512bf16",
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
  (extra entries are dropped): on the CPU ``[chunks_per_thread, prefetch_distance]`` in ``[0, 4096]``
  and ``[0, 64]`` (:data:`CPU_MAX_CHUNKS_PER_THREAD`, :data:`CPU_MAX_PREFETCH_DISTANCE`, the
  kernels' own caps in native/cpu/glue.h); on CUDA
  ``[lanes_per_row, rows_per_block, vec_width, items_per_group]`` up to
  :data:`gnncompile.hardware.cuda_knobs.EXPLICIT_KNOB_MAX` (``(32, 256, 16, 2**20)``), the bounds
  native/cuda/knobs.h applies to explicit knobs, read from the native extension (without it
  the CUDA knobs are only checked to be ints >= 0: no kernel reads them then).
* ``pin_memory``, ``persistent_workers``: true or false; ``inner``: one of
  :data:`gnncompile.compiler.backend.INNERS`; ``spmm_impl``: one of :data:`SPMM_IMPLS`, the fused
  spmm's implementation (``Settings.choices['spmm_impl']``, :mod:`gnncompile.compiler.portfolio`).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from . import __version__
from . import config as _config
from .config import INNERS  # what settings.inner may hold (None: the default)
from .hardware import cuda_knobs as _cuda_knobs
from .hardware import device as _device

FORMAT = "gnncompile-profile"
SCHEMA_VERSION = 1
SETTING_KEYS = ("knobs", "threads", "batch_size", "pool_size", "num_workers", "pin_memory",
                "persistent_workers", "inner", "spmm_impl")
#: what settings.spmm_impl may hold besides null
SPMM_IMPLS = _config.SPMM_IMPLS


#: The CPU kernels' cap on knobs[0] (chunks per thread): kMaxChunksPerThread in native/cpu/glue.h.
CPU_MAX_CHUNKS_PER_THREAD = 4096
#: The CPU kernels' cap on knobs[1] (prefetch distance, edges): kMaxPrefetchDistance in native/cpu/glue.h.
CPU_MAX_PREFETCH_DISTANCE = 64
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
    source: str = "default"  # 'file' or 'default'
    raw: Dict[str, Any] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.source == "default"

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


def default_profile(props: Optional[Dict[str, Any]] = None) -> Profile:
    p = _device.detect() if props is None else props
    return Profile(settings=_complete(_device.default_settings(p), p), device=p,
                   device_key=_device.device_key(p), source="default")


def _complete(settings: Mapping[str, Any], props: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = dict.fromkeys(SETTING_KEYS)  # (None: unset; spmm_impl has no device default)
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
    return [(0, CPU_MAX_CHUNKS_PER_THREAD), (0, CPU_MAX_PREFETCH_DISTANCE)]


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


def find(workload: Optional[Mapping[str, Any]] = None, device_props: Optional[Mapping[str, Any]] = None,
         directory: Union[str, os.PathLike, None] = None) -> Optional[Profile]:
    """The usable profile for this device whose workload is nearest to ``workload`` (an exact
    signature wins; ties go to the newest file). Unusable files are skipped with a warning."""
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
        wl = doc.get("workload") or {}
        if workload is None:
            d = 0.0
        elif doc.get("workload_signature") == workload_signature(workload):
            d = -1.0
        else:
            d = workload_distance(dict(workload), wl)
        mtime = path.stat().st_mtime
        if best is None or d < best_d[0] or (d == best_d[0] and mtime > best_d[1]):
            best, best_d = (doc, path), (d, mtime)
    if best is None:
        return None
    return _from_doc(best[0], str(best[1]), props)


def resolve(profile: Any = "auto", workload: Optional[Mapping[str, Any]] = None,
            device: Any = None, directory: Union[str, os.PathLike, None] = None) -> Profile:
    """What ``compile(profile=...)`` uses: 'auto' (the nearest profile for the detected device,
    else the defaults), a path, a :class:`Profile`, a profile document (dict) or None (the
    defaults). Never raises for a bad profile: warns and returns the defaults."""
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
        return found if found is not None else default_profile(props)
    if isinstance(profile, (str, os.PathLike)):
        p = Path(profile)
        if p.is_dir():
            found = find(workload, props, p)
            if found is None:
                warnings.warn(f"gnncompile: no usable profile for {_device.device_key(props)} in {p}; "
                              "using the defaults", ProfileWarning, stacklevel=2)
                return default_profile(props)
            return found
        return load_file(p, props)
    raise TypeError(f"gnncompile: profile must be 'auto', a path, a Profile, a dict or None; got "
                    f"{type(profile).__name__}")


__all__ = ["Profile", "ProfileWarning", "ProfileError", "cache_dir", "profile_dir", "make", "save",
           "read", "validate", "load_file", "find", "resolve", "list_profiles", "default_profile",
           "workload_signature", "workload_distance", "SCHEMA_VERSION", "SETTING_KEYS", "check_settings",
           "setting_ranges", "knob_ranges", "machine_cpus", "CPU_MAX_CHUNKS_PER_THREAD", "CPU_MAX_PREFETCH_DISTANCE",
           "MAX_BATCH_SIZE",
           "MAX_JSON_DEPTH"]
