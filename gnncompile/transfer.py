"""Transfer: a device that was never tuned starts from the profile of the nearest tuned device
class, checked by a short A/B at first use, else from the property-derived defaults.

:func:`gnncompile.profiles.find` offers the candidate (the nearest device class by
:func:`gnncompile.hardware.class_distance`, its settings adapted to this machine by
:func:`gnncompile.profiles.adapt_settings`); :func:`gate`, called by
:func:`gnncompile.profiles.resolve` (so by ``compile(profile='auto')``), decides whether it is
used, from a **verdict**:

* The check (:func:`check`) trains the candidate's own workload (:mod:`gnncompile.tuner`'s
  workloads, shrunk: :data:`WARMUP` warm-up steps, then :data:`ROUNDS` interleaved rounds of
  :data:`STEPS` steps per side, :func:`gnncompile.tuner.workloads.interleaved`) with the
  transferred settings (A) and with this device's defaults (B,
  :func:`gnncompile.hardware.default_settings`), both at the candidate's batch size (the check
  asks whether what depends on the device carries over: knobs, threads, inner compiler, loader
  workers; the batch size is the workload's). The ratio A / B of each round's pair; the
  candidate is **accepted** when the median ratio is >= 1.0 (not slower), else **rejected**.
  The geometric mean and 95% interval (:func:`gnncompile.tuner.noise.ratio_interval`) and the
  machine's load over the check are recorded too. A check that fails (an exception) or runs
  past its time is a rejection, with the reason.
* The verdict is cached in ``cache_dir()/transfer/<this key>__<source key>__<signature>.json``
  (written atomically; the check holds an exclusive lock on a ``.lock`` file beside it, so two
  processes do not measure together). A verdict names what it judged (the source file's
  ``created`` and settings, the adapted settings, the gnncompile and torch versions): when any
  differs, it is stale and the check runs again. A corrupt verdict file is ignored with a
  :class:`~gnncompile.profiles.ProfileWarning` and the check runs again.
* When the check runs: ``$GNNCOMPILE_TRANSFER`` (``settings``-free, read by
  :mod:`gnncompile.config`; ``resolve(check=...)`` overrides it): ``check`` (default) runs it at
  the first ``compile(profile='auto')`` that meets the candidate without a verdict, in a child
  process (``python -m gnncompile.cli profile check-transfer``; the compiling process keeps its
  compiled code, thread count and imports: the tuner's modules never load into it) killed after
  ``$GNNCOMPILE_TRANSFER_CHECK_S`` seconds (default 120); ``cached`` uses verdicts already cached
  and the defaults otherwise; ``off`` never transfers. ``gnncompile profile check-transfer`` runs
  the check by hand (``--force``: again).

An accepted candidate comes back as the Profile (``source == 'transfer'``,
``transferred_from``); a rejected or unchecked one as the defaults, whose ``transfer`` record
says why. :attr:`gnncompile.profiles.Profile.label` (the compiled model's
``Settings.profile``, printed by :func:`gnncompile.explain`) says which.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import _log as _logmod
from . import profiles as _profiles
from .hardware import device as _device
from .profiles import (apply_verdict, gate, judged, read_verdict, verdict_dir, verdict_path,  # noqa: F401
                       write_verdict)

_log = _logmod.get_logger(__name__)

#: warm-up steps per side (compilation happens here, not in the timed rounds)
WARMUP = 3
#: interleaved rounds (pairs); 6 pairs give a t-interval with 5 degrees of freedom
ROUNDS = 6
#: training steps per side per round
STEPS = 5
#: the batch size a workload with none recorded is checked at
DEFAULT_BATCH = {"graphs": 128, "neighbor": 1024}


# ------------------------------------------------------------------------------ the check
def arms(candidate: _profiles.Profile, props: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(transferred, defaults): the settings of the check's two sides, in
    :func:`gnncompile.tuner.workloads.measure`'s form, at the same batch size."""
    kind = candidate.workload.get("kind", "graphs")
    loader = "neighbor" if kind == "neighbor" else "pooled"
    wl = candidate.workload
    batch = (candidate.settings.get("batch_size") or wl.get("batch_size") or wl.get("default_batch_size")
             or DEFAULT_BATCH.get(kind))
    a = {k: candidate.settings.get(k) for k in _profiles.SETTING_KEYS}
    b = dict(_device.default_settings(dict(props)))
    for s in (a, b):
        s["loader"], s["batch_size"] = loader, batch
    return a, b


def measure_pair(workload: Mapping[str, Any], a: Dict[str, Any], b: Dict[str, Any], rounds: int, steps: int,
                 warmup: int, device: Optional[str]) -> Tuple[List[float], List[float], str]:
    """Throughputs of ``a`` and ``b`` over ``rounds`` interleaved rounds (and the unit): the
    measurement behind :func:`check` (tests replace it)."""
    from .tuner import workloads as W  # the tuner's workloads (no optuna): only when checking

    w = W.workload_from_dict(dict(workload, warmup=warmup, ranks=1))
    ra, rb = W.interleaved(w, [a, b], rounds=rounds, steps=steps, device=device)
    return ra, rb, w.unit


def check(candidate: _profiles.Profile, props: Optional[Mapping[str, Any]] = None, force: bool = False,
          rounds: int = ROUNDS, steps: int = STEPS, warmup: int = WARMUP,
          device: Optional[str] = None) -> Dict[str, Any]:
    """The verdict on ``candidate`` (module docstring): the cached one unless ``force`` or there
    is none, else measured now and cached. Holds the verdict's lock while it measures."""
    if candidate.source != "transfer":
        raise ValueError("gnncompile.transfer.check: not a transfer candidate (profiles.find gives one "
                         "when this device has no profile of its own)")
    p = dict(props) if props is not None else dict(candidate.device)
    with _profiles._locked(candidate):
        if not force:
            v = _profiles.read_verdict(candidate)
            if v is not None:
                return v
        a, b = arms(candidate, p)
        _log.info("transfer: checking %s (from %s) against the defaults: %d rounds of %d steps",
                  candidate.path, candidate.transfer["from"], rounds, steps)
        t0 = time.monotonic()
        from .tuner import noise as _noise

        probe = _noise.LoadProbe().start()
        try:
            ra, rb, unit = measure_pair(candidate.workload, a, b, rounds, steps, warmup,
                                        device or str(p.get("type", "cpu")))
        except KeyboardInterrupt:
            raise
        except Exception as e:
            v = _profiles._verdict(candidate, False, f"the check failed: {_logmod.error_line(e, 200)}",
                         seconds=round(time.monotonic() - t0, 2), settings=a, defaults=b)
            _profiles.write_verdict(candidate, v)
            return v
        finally:
            load = probe.stop()
        ratios = [x / y for x, y in zip(ra, rb) if x > 0 and y > 0]
        iv = _noise.ratio_interval(ra, rb)
        med = statistics.median(ratios) if ratios else None
        accepted = med is not None and med >= 1.0
        if med is None:
            reason = "no round measured both sides"
        else:
            reason = (f"median ratio {med:.3f} over {len(ratios)} rounds "
                      f"({'not slower than' if accepted else 'slower than'} the defaults)")
        v = _profiles._verdict(candidate, accepted, reason, ratio=med, interval=iv, unit=unit,
                     runs={"transferred": ra, "defaults": rb}, settings=a, defaults=b,
                     rounds=rounds, steps=steps, seconds=round(time.monotonic() - t0, 2),
                     load=load, loaded=_noise.loaded(load))
        _profiles.write_verdict(candidate, v)
        _log.info("transfer: %s %s: %s", candidate.transfer["from"],
                  "accepted" if accepted else "rejected", reason)
        return v


__all__ = ["check", "arms", "measure_pair", "gate", "apply_verdict", "read_verdict", "write_verdict",
           "verdict_path", "verdict_dir", "judged", "ROUNDS", "STEPS", "WARMUP"]
