"""How much a tuning run's measurements can be trusted: other processes' CPU use while it ran,
and the spread of repeated measurements.

A tuner on a shared machine measures the machine's load as much as its settings. Interleaving
(defaults and candidates in turn, round after round) cancels a load that comes and goes, but
not one that lasts: a process busy on one of 2 cores makes a 1-thread setting look faster than
2 threads (the second thread waits for a core), and a profile chosen that way is slower once the
machine is quiet. So the run watches the machine (:class:`LoadProbe`, from ``/proc/stat`` and
this process's own CPU time) and reports it, and the choice uses a confidence interval of the
ratio candidate / defaults over paired rounds (:func:`ratio_interval`) instead of a median.

Only Linux's ``/proc/stat`` is read; elsewhere the probe reports nothing (``None`` fields) and
the run is not called loaded.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from typing import Dict, List, Optional, Sequence, Tuple

# a run is "loaded" when other processes kept this much of a core busy on average while it
# measured, or the hypervisor took this share of the CPU time (steal)
LOADED_CORES = 0.25
LOADED_STEAL = 0.05
CONFIDENCE = 0.95

# two-sided 95% quantiles of Student's t, by degrees of freedom (1-30); above 30, 1.96 + 2.5 / df
# is within 0.3% of the exact value
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("t975: degrees of freedom must be >= 1")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.5 / df


def _cpu_jiffies() -> Optional[Tuple[float, float, float]]:
    """(busy, steal, total) seconds of all CPUs since boot, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    v = [float(x) for x in fields[1:]]
    v += [0.0] * (10 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    hz = float(os.sysconf("SC_CLK_TCK"))
    # guest time is already counted in user / nice
    busy = user + nice + system + irq + softirq
    return busy / hz, steal / hz, (busy + idle + iowait + steal) / hz


def _descendants(pid: int) -> List[int]:
    """The live descendants of ``pid`` (from /proc/PID/task/TID/children); [] where not readable."""
    out: List[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def _proc_cpu(pid: int) -> float:
    """CPU seconds of a live process and of its waited-for children (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; fields[0] is the state
    utime, stime, cutime, cstime = (float(x) for x in fields[11:15])
    return (utime + stime + cutime + cstime) / float(os.sysconf("SC_CLK_TCK"))


def _own_cpu() -> float:
    """CPU seconds of this process, of its children that have been waited for (the loader workers
    a measurement shut down) and of its live descendants (the compiler's worker processes, loader
    workers still running): the run's own work, whatever process does it."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return own + sum(_proc_cpu(p) for p in _descendants(os.getpid()))


class LoadProbe:
    """Measures other processes' CPU use over a ``with`` block (or between :meth:`start` and
    :meth:`stop`): ``others_cores`` is their busy CPU time divided by the wall time (1.0: one
    core kept busy), ``steal_fraction`` the share of CPU time the hypervisor took.

    This process's descendants are not "other processes" (loader workers, the compiler's
    workers): their CPU time, live or waited for, counts as the run's own. A descendant that
    exits and is reaped by another process in between is lost from both counts.
    """

    def __init__(self):
        self._t0 = self._j0 = self._own0 = None
        self.report: Dict[str, Optional[float]] = {}

    def start(self) -> "LoadProbe":
        self._t0, self._j0, self._own0 = time.monotonic(), _cpu_jiffies(), _own_cpu()
        return self

    def stop(self) -> Dict[str, Optional[float]]:
        self.report = self.peek()
        return self.report

    def peek(self) -> Dict[str, Optional[float]]:
        """The report so far, the probe still running."""
        wall = time.monotonic() - self._t0
        j1, own = _cpu_jiffies(), _own_cpu() - self._own0
        rep: Dict[str, Optional[float]] = {"wall_s": round(wall, 3), "cpus": os.cpu_count(),
                                           "others_cores": None, "steal_fraction": None}
        if self._j0 is not None and j1 is not None and wall > 0:
            busy, steal, total = (b - a for a, b in zip(self._j0, j1))
            rep["others_cores"] = round(max(0.0, busy - own) / wall, 3)
            rep["steal_fraction"] = round(steal / total, 4) if total > 0 else 0.0
        return rep

    def __enter__(self) -> "LoadProbe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def loaded(report: Optional[Dict[str, Optional[float]]]) -> bool:
    """Whether a probe's report says the machine was busy with other work."""
    if not report:
        return False
    cores, steal = report.get("others_cores"), report.get("steal_fraction")
    return bool((cores is not None and cores > LOADED_CORES) or (steal is not None and steal > LOADED_STEAL))


def ratio_interval(candidate: Sequence[float], default: Sequence[float]) -> Optional[Dict[str, float]]:
    """The ratio candidate / defaults of throughputs measured in the same rounds (the i-th run of
    each is a pair): its geometric mean and 95% confidence interval (Student's t over the
    logarithms of the paired ratios). ``low`` and ``high`` are None with one pair (no spread to
    estimate); None when there is no pair with positive values."""
    logs: List[float] = [math.log(c / d) for c, d in zip(candidate, default) if c > 0 and d > 0]
    n = len(logs)
    if n == 0:
        return None
    m = statistics.fmean(logs)
    out: Dict[str, float] = {"ratio": math.exp(m), "low": None, "high": None, "pairs": n,
                             "half_width_log": None, "confidence": CONFIDENCE}
    if n >= 2:
        half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        out.update(low=math.exp(m - half), high=math.exp(m + half), half_width_log=half)
    return out


def faster_with_confidence(iv: Optional[Dict[str, float]]) -> bool:
    """True when the interval lies above 1: the candidate is faster than the defaults at the
    interval's confidence."""
    return bool(iv and iv.get("low") is not None and iv["low"] > 1.0)


def spread(values: Sequence[float]) -> Optional[float]:
    """Coefficient of variation of repeated measurements (None for fewer than 2)."""
    vals = [float(v) for v in values]
    if len(vals) < 2 or statistics.fmean(vals) == 0:
        return None
    return statistics.stdev(vals) / statistics.fmean(vals)


__all__ = ["LoadProbe", "loaded", "ratio_interval", "faster_with_confidence", "spread", "t975",
           "LOADED_CORES", "LOADED_STEAL", "CONFIDENCE"]
