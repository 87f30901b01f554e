"""Building generated kernels: C++ source -> a shared library in the disk cache -> loaded.

* **Key.** sha256 of the source, every header it includes (native/common, native/cpu), the
  compiler's identity (its ``--version``), the flags and the ISA (machine, CPU model and feature
  flags: the flags hold ``-march=native``). The library is ``<cache folder>/kernels/<key>.so``
  (:func:`gnncompile.profiles.cache_dir`), shared by every process.
* **Build.** The system C++ compiler (``$GNNCOMPILE_CXX``, else ``c++``) with the native module's
  own optimisation flags (its build_info: ``-O3 -march=native``), ``-std=gnu++17 -fPIC -shared``,
  ``-ffp-contract=off`` (see emit.py), ``-fno-trapping-math`` (the float32 math of
  native/cpu/vmath.h vectorizes only where a speculated operation may not raise a floating-point
  exception: no value changes; the interpreter's message.cpp is compiled with both) and no torch
  headers: about a second per program. Threads
  are not the kernel's business: the glue runs it per chunk of its row split on torch's pool.
* **Concurrency.** Each process compiles to a temporary name in the cache folder and renames it
  onto the key (``os.replace``, atomic): two processes building one key both succeed, one file
  wins, both load a complete library (a process that loaded the other's keeps its mapping).
* **Corruption.** A cached library that fails to load, or reports another ABI, is removed and
  rebuilt once.
* **Bound.** After a build, the least recently used libraries (mtime, refreshed on every load)
  are removed until the folder holds at most ``$GNNCOMPILE_CODEGEN_CACHE_MB`` (default 256).

Loading is :mod:`ctypes` (``RTLD_LOCAL``); a loaded library is never unloaded (its address is
registered with the native glue for the life of the process).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import config as _config

NATIVE = Path(__file__).resolve().parent.parent.parent / "native"
HEADERS = ("common/dtype.h", "common/macros.h", "cpu/codegen_abi.h", "cpu/encoder_core.h", "cpu/reduce_core.h",
           "cpu/rows_core.h", "cpu/vmath.h")
SYMBOL = "gnncompile_message_rows"
ABI_SYMBOL = "gnncompile_codegen_abi"
BASE_FLAGS = ("-std=gnu++17", "-fPIC", "-shared", "-ffp-contract=off", "-fno-trapping-math")


class BuildError(RuntimeError):
    """A generated kernel could not be compiled or loaded."""


_lock = threading.Lock()
_loaded: Dict[str, Tuple[ctypes.CDLL, int]] = {}  # key -> (library, address); never unloaded
#: what this process did (tests read it): compiler runs, loads from the disk cache, rebuilds of a
#: corrupt cached library, evictions
stats = {"builds": 0, "disk_hits": 0, "rebuilds": 0, "evicted": 0, "build_s": 0.0, "load_s": 0.0}
_compiler_id: Dict[str, str] = {}


def compiler() -> str:
    return _config.current().cxx or "c++"


def _compiler_identity(cxx: str) -> str:
    """The first line of ``cxx --version`` (raises BuildError when it does not run)."""
    argv = shlex.split(cxx)
    exe = shutil.which(argv[0]) if argv else None
    if exe is None:
        raise BuildError(f"no C++ compiler: {cxx!r} is not on the PATH")
    memo = "\0".join([exe] + argv[1:])  # the compiler the PATH gives now
    if memo in _compiler_id:
        return _compiler_id[memo]
    try:
        r = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"the C++ compiler {cxx!r} does not run: {exc}") from exc
    if r.returncode != 0:
        raise BuildError(f"the C++ compiler {cxx!r} does not run: {r.stderr.strip()[:200]}")
    ident = (r.stdout.splitlines() or [""])[0].strip()
    _compiler_id[memo] = ident
    return ident


def module_flags() -> List[str]:
    """The native module's optimisation flags (-O3, -march=native where it was built with it)."""
    try:
        from ..ops import _native
        flags = _native.build_info().get("cxx_flags", "")
    except Exception:  # pragma: no cover - the module reports them whenever it is loaded
        flags = ""
    return shlex.split(flags) or ["-O3"]


def _isa() -> str:
    """The machine and CPU the -march=native code is for."""
    model, feats = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not model and line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif not feats and line.startswith(("flags", "Features")):
                    feats = hashlib.sha256(line.split(":", 1)[1].encode()).hexdigest()[:16]
                if model and feats:
                    break
    except OSError:
        pass
    return f"{platform.machine()}|{model}|{feats}"


def cache_folder() -> Path:
    from .. import profiles
    return profiles.cache_dir() / "kernels"


def key_of(source: str, flags: List[str], cxx_id: str) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(flags), "\0".join(BASE_FLAGS), cxx_id, _isa()):
        h.update(part.encode())
        h.update(b"\0")
    for name in HEADERS:
        h.update((NATIVE / name).read_bytes())
    return h.hexdigest()[:32]


def _load(path: Path) -> Tuple[ctypes.CDLL, int]:
    lib = ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LOCAL", 0))
    abi = ctypes.CFUNCTYPE(ctypes.c_int)((ABI_SYMBOL, lib))()
    from .emit import ABI
    if abi != ABI:
        raise OSError(f"{path} has ABI {abi}, expected {ABI}")
    return lib, ctypes.cast(getattr(lib, SYMBOL), ctypes.c_void_p).value


def _compile(source: str, out: Path, cxx: str, flags: List[str]) -> None:
    folder = out.parent
    fd, tmp_so = tempfile.mkstemp(prefix=out.stem + ".", suffix=".so.tmp", dir=folder)
    os.close(fd)
    src = Path(tmp_so[:-len(".so.tmp")] + ".cpp")
    try:
        src.write_text(source)
        argv = shlex.split(cxx) + flags + list(BASE_FLAGS) + ["-I", str(NATIVE), str(src), "-o", tmp_so]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BuildError(f"{cxx!r} failed to run: {exc}") from exc
        if r.returncode != 0:
            raise BuildError(f"{cxx!r} failed (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
        os.replace(tmp_so, out)  # atomic: another process sees the old file, the new one, or none
    finally:
        for p in (Path(tmp_so), src):
            try:
                p.unlink()
            except FileNotFoundError:
                pass


def _evict(folder: Path, keep: Path) -> None:
    bound = _config.current().codegen_cache_mb * 1e6
    entries = []
    for p in folder.glob("*.so"):
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        entries.append((st.st_mtime, st.st_size, p))
    total = sum(e[1] for e in entries)
    for _, size, p in sorted(entries):
        if total <= bound:
            break
        if p == keep:
            continue
        try:
            p.unlink()  # a process that loaded it keeps its mapping
            stats["evicted"] += 1
        except FileNotFoundError:
            pass
        total -= size


def load_kernel(source: str) -> int:
    """The address of ``source``'s kernel function: from this process, the disk cache, or built
    now. Raises :class:`BuildError` when no compiler works or the build fails."""
    cxx = compiler()
    flags = module_flags()
    cxx_id = _compiler_identity(cxx)
    key = key_of(source, flags, cxx_id)
    with _lock:
        if key in _loaded:
            return _loaded[key][1]
        folder = cache_folder()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{key}.so"
        if path.exists():
            t0 = time.perf_counter()
            try:
                lib, addr = _load(path)
                stats["disk_hits"] += 1
                stats["load_s"] += time.perf_counter() - t0
                try:
                    os.utime(path)  # recently used: the eviction goes by mtime
                except OSError:
                    pass
                _loaded[key] = (lib, addr)
                return addr
            except OSError:  # corrupt, truncated or of another ABI: rebuilt
                stats["rebuilds"] += 1
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        t0 = time.perf_counter()
        _compile(source, path, cxx, flags)
        stats["builds"] += 1
        stats["build_s"] += time.perf_counter() - t0
        try:
            lib, addr = _load(path)
        except OSError as exc:
            raise BuildError(f"the kernel built at {path} does not load: {exc}") from exc
        _loaded[key] = (lib, addr)
        _evict(folder, path)
        return addr


__all__ = ["BuildError", "load_kernel", "cache_folder", "compiler", "module_flags", "stats", "key_of"]
