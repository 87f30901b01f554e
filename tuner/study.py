"""The Optuna study: search, storage, resume, and the profile it writes.

``tune(workload, trials=..., timeout=..., storage=..., out=...)``:

* storage: any Optuna storage URL, ``journal:PATH`` or a path ending in .log / .journal (an
  Optuna journal file), or a storage object; default ``sqlite:///<cache dir>/tuner/studies.db``
  (:func:`gnncompile.profiles.cache_dir`). The study is named after the device key and the
  workload signature and opened with ``load_if_exists``: a run that was interrupted (Ctrl-C,
  kill) resumes with every completed trial kept, and several processes (or machines, given an
  RDB URL) can work on one study at once. ``trials`` is the number of finished (complete or
  pruned) trials the study should hold: a resumed or parallel run only adds what is missing.
* search space: batch size (fixed at ``batch_size`` unless asked: ``tune_batch_size=True`` or a
  ``batch_range`` searches it on a log scale, by default in :data:`GRAPHS_BATCH_RANGE` or
  :data:`tuner.workloads.NEIGHBOR_BATCH_RANGE`, and the defaults are measured at ``batch_size``;
  the profile's ``batch_size_rule`` says whether it was tuned and the learning-rate rescaling
  that goes with it, :func:`batch_size_rule`), pool size
  (on a neighbor workload the prefetch depth, searched only with workers), num_workers, persistent workers, pin memory (CUDA only), threads, and the
  kernel knobs (``chunks_per_thread``, ``prefetch_distance`` (:data:`PREFETCH_CHOICES`, 0: the kernels' rule by row width) and the spmm's ``block_budget_kib``, :func:`block_budget_choices`, on CPU; lanes per row, rows per block and items per group on CUDA) and
  the inner compiler (one of :data:`gnncompile.compiler.INNERS`) when the workload is compiled.
  A data-parallel neighbor workload (``Workload(ranks=N)``, N > 1: each trial is N gloo rank
  processes, :func:`tuner.workloads.measure`) searches threads per rank, up to CPUs / N, and
  records ``ranks`` in the workload (so in the study's name and the profile).
* objective: training throughput after warm-up (:func:`tuner.workloads.measure`), reported
  per chunk so that the median pruner stops hopeless trials. Peak memory above
  ``memory_budget`` makes a trial infeasible (Optuna constraint, and the trial fails). A trial
  that raises (out of memory, a crash) is recorded as failed and the study goes on.
* the defaults (:func:`tuner.workloads.default_settings`) are measured in the same run, and
  the profile records tuned vs default throughput. The profile JSON goes to ``out`` (default
  :func:`gnncompile.profiles.profile_dir`) with the optimisation history and parameter
  importance plots as PNG next to it. Several tuners of one study finishing together: the
  file keeps the faster result (:func:`save_if_better`, under a lock file).
* timeout: one deadline for the whole run (opening the study, trials, re-measurements, profile,
  plots; :mod:`tuner.guard`), planned with the durations of this run's trials (:class:`_Budget`):
  the trials go on while one more trial and two rounds of re-measurements after it fit, then the
  re-measurements run, the defaults first, while the next one fits. The defaults' first measurement always starts: they are the reference of the
  profile, and a run whose deadline comes before they are measured writes no profile
  (``result["no_profile"]`` says why). A trial cut by the deadline is recorded as failed, a
  re-measurement cut by it is dropped; plots are skipped with less than 3 s left. Overshoot: one
  training step and closing the loader.
* interrupts: Ctrl-C raises KeyboardInterrupt at the next training step (:mod:`tuner.guard`);
  completed trials stay, the running one is marked failed, no profile is written.
* arguments that cannot work (trials < 1, timeout <= 0, batch size < 1, a batch range with
  MIN > MAX, an ``out`` that cannot be written) raise :class:`SetupError` before anything runs.
"""
from __future__ import annotations

import os
import socket
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from gnncompile.hardware import device as _device
from gnncompile.compiler import INNERS
from gnncompile import profiles as _profiles

from . import guard as _guard
from . import noise as _noise
from .workloads import (NEIGHBOR_BATCH_RANGE, MemoryBudgetExceeded, Workload, default_settings, measure,
                        prepare)


def default_storage() -> str:
    d = _profiles.cache_dir() / "tuner"
    d.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{d / 'studies.db'}"


def workload_dict(w: Workload, batch_size: Optional[int] = 128,
                  batch_range: Optional[Tuple[int, int]] = None) -> Dict[str, Any]:
    """The workload as recorded in the study and the profile (with the batch-size search; a
    neighbor workload always searches it, in :data:`NEIGHBOR_BATCH_RANGE` unless given a range,
    and records the defaults' batch size too)."""
    d = w.signature_dict()
    if w.kind in ("graphs", "neighbor"):
        if batch_range is not None:
            d["batch_range"] = [int(batch_range[0]), int(batch_range[1])]
            d["default_batch_size"] = int(batch_size or 128)
        else:
            d["batch_size"] = int(batch_size or 128)
    return d


#: the batch sizes a graphs workload searches with ``tune_batch_size`` and no range
GRAPHS_BATCH_RANGE = (32, 512)


def batch_search(w: Workload, tune_batch_size: Optional[bool],
                 batch_range: Optional[Tuple[int, int]]) -> Optional[Tuple[int, int]]:
    """The batch-size range a run searches, None when the batch size stays fixed.

    The batch size changes the optimisation (the gradient's noise, the steps per epoch), so it is
    searched only when asked: ``tune_batch_size=True`` (``--tune-batch-size``), in ``batch_range``
    or the workload's default range (:data:`GRAPHS_BATCH_RANGE`, :data:`NEIGHBOR_BATCH_RANGE`);
    a ``batch_range`` alone asks for it too (``tune_batch_size=None``). A full-graph workload has
    no batch size."""
    if tune_batch_size is False and batch_range is not None:
        raise SetupError("a batch range searches the batch size: drop tune_batch_size=False "
                         "(--batch-range with a fixed batch size cannot work)")
    if w.kind not in ("graphs", "neighbor"):
        if tune_batch_size:
            raise SetupError(f"a {w.kind} workload has no batch size to tune")
        return None
    if not (tune_batch_size or batch_range is not None):
        return None
    if batch_range is not None:
        return (int(batch_range[0]), int(batch_range[1]))
    return NEIGHBOR_BATCH_RANGE if w.kind == "neighbor" else GRAPHS_BATCH_RANGE


#: how a tuned batch size carries over to the learning rate, stated in the profile: the
#: workloads train with Adam, whose usual rule is the square root of the batch ratio (SGD's is
#: the ratio itself); the tuner measures throughput only, never the loss at the new rate
LR_SCALING = "sqrt"


def batch_size_rule(settings: Dict[str, Any], wl: Dict[str, Any]) -> Dict[str, Any]:
    """The profile's statement of its batch size: fixed, or tuned, and then the learning-rate
    rescaling a user applies when moving from the reference batch size to the chosen one."""
    chosen = settings.get("batch_size")
    if "batch_range" not in wl:
        return {"tuned": False, "batch_size": chosen}
    ref = int(wl.get("default_batch_size") or 128)
    rule = {"tuned": True, "batch_size": chosen, "reference_batch_size": ref,
            "range": list(wl["batch_range"]), "lr_scaling": LR_SCALING}
    if chosen:
        rule["lr_factor"] = (chosen / ref) ** 0.5 if LR_SCALING == "sqrt" else chosen / ref
        rule["rule"] = (f"lr = lr_at_{ref} * sqrt({chosen} / {ref}) for Adam (the tuner's optimizer); "
                        f"SGD: lr = lr_at_{ref} * {chosen} / {ref}; the tuned batch changes the optimisation: "
                        "check the loss curve")
    return rule


#: what the profile says of a bf16 choice (settings.precision = 'bf16'): applied only where the
#: user opts in (gnncompile.settings: a profile's 'bf16' is dropped otherwise)
PRECISION_OPT_IN = ("choices['precision'] = 'bf16' (or GNNCOMPILE_PRECISION=bf16) in the program that "
                    "loads the profile; without it the profile's other settings apply in float32")


def precision_rule(settings: Dict[str, Any], wl: Dict[str, Any]) -> Dict[str, Any]:
    """The profile's statement of its precision: whether the study searched bf16 (tune
    --allow-bf16) and, when the chosen settings gather bfloat16, that they compute in lower
    precision and only under the user's opt-in (the measured speed assumed it)."""
    rule: Dict[str, Any] = {"precision": settings.get("precision") or "fp32",
                            "bf16_searched": bool(wl.get("allow_bf16"))}
    if rule["precision"] == "bf16":
        rule.update(opt_in=True, applied_only_with=PRECISION_OPT_IN,
                    computes=("the fused spmm's sum / mean gather bfloat16 features (x rounded to 8 "
                              "significant bits, fp32 accumulation, float32 output): each output element "
                              "within 2^-8 of the sum of its |terms|; every other op in float32"),
                    accuracy="check your model's accuracy in bf16 (benchmarks/bf16.py --profile)")
    return rule


def study_name(w: Workload, props: Optional[dict] = None, batch_size: Optional[int] = 128,
               batch_range: Optional[Tuple[int, int]] = None) -> str:
    p = _device.detect() if props is None else props
    sig = _profiles.workload_signature(workload_dict(w, batch_size, batch_range))
    return f"{_device.device_key(p)}__{sig}"


def _optuna():
    try:
        import optuna
    except ImportError as e:  # pragma: no cover
        raise ImportError("the tuner needs optuna: pip install 'gnncompile[tune]'") from e
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def block_budget_choices(props: Mapping[str, Any]) -> List[int]:
    """The spmm's column-block budgets (CPU knobs[2], KiB) a trial may pick: 0 (no blocking, the
    default: blocking measured slower at every point on a 2-core AMD EPYC, Zen 2, whose L3 the
    walk does not find much faster than memory: benchmarks/results/HISTORY.md, section 26) and a
    quarter, half and all of the detected L3 (or of 16 MiB where sysfs names no L3)."""
    l3 = props.get("l3_bytes") if isinstance(props, Mapping) else None
    kib = (int(l3) if isinstance(l3, int) and not isinstance(l3, bool) and l3 > 0 else 16 << 20) // 1024
    return [0] + sorted({max(1, kib // 4), max(1, kib // 2), kib})


#: the spmm's prefetch distances (CPU knobs[1], edges read ahead) a trial may pick: 0 is the
#: kernels' own rule by row width (native/cpu/glue.h: 32 edges for rows under 512 bytes, such as
#: 64 float32 or bfloat16 features, else 4), which the explicit distances cannot express: without it
#: every trial of a 64-wide full-graph GCN read 2-16 edges ahead while its defaults read 32
#: (benchmarks/results/tuning_fullgraph_bf16_zen4_s59.md)
PREFETCH_CHOICES = [0, 2, 4, 8, 16]
#: the choices before 0 was added: a study whose trials already hold them keeps them (Optuna
#: refuses another set of choices for a parameter of an existing study)
LEGACY_PREFETCH_CHOICES = [2, 4, 8, 16]


def prefetch_choices(trial) -> List[int]:
    """PREFETCH_CHOICES, or the choices the trial's study already recorded for prefetch_distance
    (a study begun before 0 was a choice resumes with LEGACY_PREFETCH_CHOICES)."""
    study = getattr(trial, "study", None)
    if study is not None:
        for t in study.get_trials(deepcopy=False):
            d = t.distributions.get("prefetch_distance")
            if d is not None and hasattr(d, "choices"):
                return list(d.choices)
    return list(PREFETCH_CHOICES)


def suggest(trial, w: Workload, props: dict, batch_size: Optional[int],
            batch_range: Optional[Tuple[int, int]], max_workers: int) -> Dict[str, Any]:
    """The settings of one trial."""
    cuda = props.get("type") == "cuda"
    cpus = int(props.get("logical_cpus") or props.get("host_logical_cpus") or os.cpu_count() or 1)
    s: Dict[str, Any] = {"loader": "pooled"}
    if w.kind == "neighbor":
        s["loader"] = "neighbor"
        if batch_range is not None:
            s["batch_size"] = trial.suggest_int("batch_size", batch_range[0], batch_range[1], log=True)
        else:
            s["batch_size"] = int(batch_size or 1024)
        s["num_workers"] = trial.suggest_int("num_workers", 0, max_workers)
        # batches in flight (the DataLoader's prefetch depth): only with workers
        s["pool_size"] = trial.suggest_int("pool_size", 1, 6) if s["num_workers"] > 0 else None
        _suggest_worker_flags(trial, s, cuda)
    elif w.kind == "graphs":
        if batch_range is not None:
            s["batch_size"] = trial.suggest_int("batch_size", batch_range[0], batch_range[1], log=True)
        else:
            s["batch_size"] = int(batch_size or 128)
        s["pool_size"] = trial.suggest_int("pool_size", 1, 6)
        s["num_workers"] = trial.suggest_int("num_workers", 0, max_workers)
        _suggest_worker_flags(trial, s, cuda)
    else:
        s.update(batch_size=None, pool_size=None, num_workers=0, persistent_workers=False,
                 pin_memory=False)
    # threads per process: a data-parallel trial's ranks share the CPUs
    s["threads"] = None if cuda else trial.suggest_int("threads", 1, max(1, cpus // w.ranks))
    default_knobs = _device.default_settings(props)["knobs"]
    if w.compiled:
        if cuda:
            lanes = trial.suggest_categorical("lanes_per_row", [0, 4, 8, 16, 32])
            # lane groups per block (0: the launch rule's, block = min(256, threads per SM / 4))
            rows = trial.suggest_categorical("rows_per_block", [0, 2, 4, 8, 16])
            items = trial.suggest_categorical("items_per_group", [0, 64, 256, 1024])
            s["knobs"] = [lanes, rows, 0, items]
        else:
            s["knobs"] = [trial.suggest_categorical("chunks_per_thread", [1, 2, 4, 8, 16]),
                          trial.suggest_categorical("prefetch_distance", prefetch_choices(trial)),
                          trial.suggest_categorical("block_budget_kib", block_budget_choices(props))]
        # the compiler for the rest of the graph: which one wins depends on the model and the
        # graph sizes (benchmarks/results/inner_rule.md; earlier measurements in
        # benchmarks/results/HISTORY.md, "Inner compiler")
        s["inner"] = trial.suggest_categorical("inner", list(INNERS))
        # the fused spmm's implementation (gnncompile.compiler.portfolio): ours or the vendor
        # library's; on CUDA only ours is admitted
        s["spmm_impl"] = None if cuda else trial.suggest_categorical("spmm_impl", ["native", "torch_sparse"])
        # bf16 gathering lowers precision: searched only where the user allowed it (--allow-bf16;
        # gnncompile.passes.precision gathers bf16 on the CPU only)
        s["precision"] = (trial.suggest_categorical("precision", ["fp32", "bf16"])
                          if w.allow_bf16 and not cuda else None)
    else:
        s["knobs"] = default_knobs
    return s


def _suggest_worker_flags(trial, s: Dict[str, Any], cuda: bool) -> None:
    s["persistent_workers"] = (trial.suggest_categorical("persistent_workers", [True, False])
                               if s["num_workers"] > 0 else False)
    s["pin_memory"] = trial.suggest_categorical("pin_memory", [True, False]) if cuda else False


HEARTBEAT_S = 15


def _rdb_backend(storage) -> Optional[str]:
    """The database behind an RDB storage URL ('sqlite', 'postgresql', ...), None otherwise."""
    if not isinstance(storage, str) or "://" not in storage:
        return None
    try:
        from sqlalchemy.engine import make_url

        return make_url(storage).get_backend_name()
    except Exception:
        return None


class StorageError(RuntimeError):
    """The study's storage cannot be opened (bad URL, unreachable server, missing driver)."""


class SetupError(ValueError):
    """An argument of the run that cannot work (found before anything is measured)."""


class NoProfileWarning(UserWarning):
    """The run's timeout came before the defaults were measured: no profile was written."""


JOURNAL_SUFFIXES = (".log", ".journal")


def journal_path(storage) -> Optional[str]:
    """The file of a journal storage spec: ``journal:PATH``, or a path (no ``://``) ending in
    .log or .journal; None for anything else (an RDB URL, a storage object)."""
    if not isinstance(storage, str):
        return None
    if storage.startswith("journal:"):
        return os.path.expanduser(storage[len("journal:"):]) or None
    if "://" not in storage and storage.endswith(JOURNAL_SUFFIXES):
        return os.path.expanduser(storage)
    return None


def _open_study(optuna, name, storage, sampler, pruner, attempts: int = 6):
    """create_study(load_if_exists=True), retried: processes that open a new database at the
    same moment race to create its tables, and the loser sees 'table ... already exists'. Other
    errors (a bad URL, a server that does not answer, a missing driver) raise StorageError at
    once, with the URL's password left out."""
    import random

    backend = _rdb_backend(storage)
    journal = journal_path(storage)
    # a SQLite or journal file in a folder that does not exist yet: create the folder, as the
    # default does (a folder that cannot be made, e.g. under a file, is a StorageError now)
    path = journal or (storage[len("sqlite:///"):] if backend == "sqlite" and storage.startswith("sqlite:///")
                       else "")
    if path and path != ":memory:":
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot open {_redact(storage)}: cannot create the folder of {path}: "
                               f"{e.strerror or e}") from None
    try:
        from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
        racy: tuple = (IntegrityError, OperationalError, ProgrammingError)
    except ImportError:  # pragma: no cover - optuna's RDB storage needs sqlalchemy
        racy = ()
    for i in range(attempts):
        try:
            st = storage
            if journal is not None:
                st = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(journal))
            elif backend is not None:
                # heartbeats: a trial whose process was killed is marked failed by the next run
                # (instead of staying RUNNING forever)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    st = optuna.storages.RDBStorage(storage, heartbeat_interval=HEARTBEAT_S,
                                                    grace_period=4 * HEARTBEAT_S,
                                                    engine_kwargs={"pool_pre_ping": True}
                                                    if backend != "sqlite" else None)
            return optuna.create_study(study_name=name, storage=st, direction="maximize",
                                       sampler=sampler, pruner=pruner, load_if_exists=True)
        except racy as e:
            # the table-creation race, or a server still starting: retry a few times
            if i == attempts - 1:
                raise StorageError(f"cannot open the study in {_redact(storage)}: "
                                   f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
            time.sleep(0.2 * (i + 1) + random.random() * 0.3)
        except ImportError as e:
            raise StorageError(f"cannot open {_redact(storage)}: {e} (install the database "
                               "driver, e.g. psycopg2-binary for PostgreSQL)") from None
        except Exception as e:
            raise StorageError(f"cannot open the study in {_redact(storage)}: "
                               f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def fail_orphans(study) -> list:
    """Marks FAIL the RUNNING trials whose worker process, on this host, no longer exists (a run
    killed mid-trial); returns their numbers. Heartbeats do the same for any host, but only once
    the grace period has passed, so a run resumed at once would otherwise leave the killed trial
    RUNNING. Trials of other hosts, or of live processes, are left alone, and so is a trial killed
    before it recorded its worker (its first statement): the heartbeat fails that one later."""
    import optuna

    host = socket.gethostname()
    failed = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        worker = str(t.user_attrs.get("worker") or "")
        h, _, pid = worker.rpartition(":")
        if h != host or not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
            continue
        try:
            study._storage.set_trial_user_attr(t._trial_id, "error", f"worker {worker} died mid-trial")
            if study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL):
                failed.append(t.number)
        except Exception:  # another process got there first, or the trial finished meanwhile
            pass
    return failed


def _settings_of(trial: Any) -> Dict[str, Any]:
    return dict(trial.user_attrs.get("settings") or {})


def _sampler(optuna, trials: int, seed: Optional[int]):
    """(TPE sampler, constrain(trial, excess)): peak memory is a constraint (<= 0 feasible).
    Optuna >= 5 takes it from the trial (Trial.set_constraint); older versions from the
    sampler's constraints_func."""
    new_api = hasattr(optuna.trial.Trial, "set_constraint")
    skw = {} if new_api else {"constraints_func": lambda t: [float(t.user_attrs.get("memory_excess", 0.0))]}
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(trials // 3, 1)), **skw)

    def constrain(trial, excess: float) -> None:
        trial.set_user_attr("memory_excess", excess)
        if new_api:
            trial.set_constraint("peak_memory_over_budget", excess)

    return sampler, constrain


def _objective(optuna, w: Workload, props: dict, constrain, batch_size, batch_range, max_workers: int,
               memory_budget: Optional[int], device: Optional[str]):
    """One trial: suggested settings, measured; failures are recorded on the trial."""

    def objective(trial):
        # first, so that a run killed mid-trial is recognised by the next one (fail_orphans)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        try:
            return measured(trial)
        except KeyboardInterrupt:
            # Optuna marks the trial FAIL and re-raises: the run stops, the study keeps the rest
            trial.set_user_attr("error", "interrupted (Ctrl-C)")
            raise
        except Exception as e:
            if _guard.active() is not None and _guard.active().interrupts:
                # a loader worker killed by the same Ctrl-C: an interrupt, not a failed trial
                trial.set_user_attr("error", "interrupted (Ctrl-C)")
                raise KeyboardInterrupt from e
            raise

    def measured(trial):
        _guard.checkpoint()
        s = suggest(trial, w, props, batch_size, batch_range, max_workers)
        trial.set_user_attr("settings", s)
        # feasible unless the measurement says otherwise; Optuna >= 5 keeps the first value of a
        # trial's constraint and ignores later ones, so it is set once, when it is known
        trial.set_user_attr("memory_excess", 0.0)

        def report(step, value):
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned()

        try:
            value, peak = measure(w, s, report=report, device=device, memory_budget=memory_budget)
        except MemoryBudgetExceeded as e:
            constrain(trial, 1.0)
            trial.set_user_attr("error", str(e))
            raise
        except (torch.OutOfMemoryError, MemoryError) as e:
            constrain(trial, 1.0)
            trial.set_user_attr("error", f"out of memory: {e}")
            raise
        except optuna.TrialPruned:
            raise
        except Exception as e:
            trial.set_user_attr("error", f"{type(e).__name__}: {e}")
            raise
        trial.set_user_attr("peak_memory", int(peak))
        constrain(trial, 0.0)
        _guard.checkpoint(deadline=False)  # a measurement that finished counts
        return value

    return objective


def _candidates(ranked: list, top: int) -> list:
    """The best trials with distinct settings, at most ``top``."""
    cands, seen = [], set()
    for t in ranked:
        key = repr(sorted(_settings_of(t).items()))
        if key not in seen:
            seen.add(key)
            cands.append(t)
        if len(cands) >= max(1, top):
            break
    return cands


class _Ablation:
    """A confirmation candidate that is not a trial: the defaults with one dimension (a top-level
    setting, ``dimension``) of trial ``source`` (the study's best) changed to that trial's value.
    A multi-dimension winner of the trials is partly noise (one short measurement each); its
    ablations show whether a single dimension carries the gain (on the GCN full-graph workload
    here, bf16 alone re-measured 1.18x the defaults, the best trial with three more changed
    dimensions 1.04x). ``number`` is a negative key, distinct from every trial's."""

    def __init__(self, number: int, source: Any, dimension: str, settings: Dict[str, Any]) -> None:
        self.number, self.source, self.dimension = number, source, dimension
        self.value = None
        self.user_attrs = {"settings": settings}


# the settings an ablation changes alone: the compiler's (the loader's settings only mean
# something together, with the loader itself, which the defaults keep)
ABLATION_DIMS = ("threads", "knobs", "inner", "spmm_impl", "precision")


def _ablations(best: Any, defaults: Dict[str, Any], cands: list) -> list:
    """The defaults with each single compiler setting (``ABLATION_DIMS``) of ``best`` that
    differs from them changed to ``best``'s value, one :class:`_Ablation` per such setting (in the settings' order), except
    those equal to a candidate already in ``cands`` (or to ``best`` itself: a one-dimension
    trial)."""
    seen = {repr(sorted(_settings_of(t).items())) for t in cands}
    seen.add(repr(sorted(_settings_of(best).items())))
    out = []
    for k, v in _settings_of(best).items():
        if k not in ABLATION_DIMS or defaults.get(k) == v:
            continue
        s = dict(defaults, **{k: v})
        key = repr(sorted(s.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(_Ablation(-1 - len(out), best, k, s))
    return out


def _describe(t: Any) -> str:
    if isinstance(t, _Ablation):
        return f"ablation {t.dimension!r} of trial {t.source.number}"
    return f"trial {t.number}"


def _notify(callbacks, event: str, *args) -> None:
    """Calls ``cb.<event>(*args)`` on the callbacks that have it (the CLI's progress bar:
    ``begin(finished_trials)`` once the study is open, ``phase(text)`` during re-measurement)."""
    for cb in callbacks:
        fn = getattr(cb, event, None)
        if callable(fn):
            fn(*args)


# re-measurement goes on past ``confirm_rounds`` (the defaults and the leading candidate, one
# round at a time) until the leader's 95% interval of its ratio to the defaults is this narrow
# (half-width, in log: 0.03 is about +-3%), or the rounds reach MAX_CONFIRM_ROUNDS, or the time is up
RATIO_HALF_WIDTH = 0.03
MAX_CONFIRM_ROUNDS = 8
LOAD_SENSITIVE = ("threads",)  # settings a lasting load biases (kept at the defaults' value under load)


def _machine_loaded(report) -> bool:
    """Whether a load report says other processes kept the machine busy (:func:`tuner.noise.loaded`;
    one name the tuner's tests can replace, whose stand-in measurements the machine's load must
    not steer)."""
    return _noise.loaded(report)


def _keeps_load_sensitive(settings: Dict[str, Any], defaults: Dict[str, Any]) -> bool:
    """Whether ``settings`` keep every ``LOAD_SENSITIVE`` setting at the defaults' value."""
    return all(settings.get(k) == defaults.get(k) for k in LOAD_SENSITIVE)


def _confirm(w: Workload, cands: list, defaults: Dict[str, Any], rounds: int, device, result: dict,
             guard: Optional[_guard.RunGuard] = None, trial_s: Optional[float] = None, callbacks=()):
    """Re-measures the defaults and the candidates in turn, the defaults first, ``rounds`` times,
    then the defaults and the leading candidate until the leader's ratio is known to
    ``RATIO_HALF_WIDTH`` (at most ``MAX_CONFIRM_ROUNDS`` rounds in all). Each candidate's ratio
    to the defaults comes from the rounds' pairs (:func:`tuner.noise.ratio_interval`: geometric
    mean, 95% interval); the leader is the candidate with the highest ratio (returns its trial;
    None when no candidate was re-measured, or the re-measurement failed: the trials' values
    stand). Whether the profile takes the leader or the defaults is decided from its interval
    (:func:`_write_profile`).

    The machine is watched while this runs (:class:`tuner.noise.LoadProbe`); when other
    processes kept it busy (``result["noise"]["loaded"]``), a candidate that changes a
    load-sensitive setting (``LOAD_SENSITIVE``: the thread count) cannot lead: a process busy
    on one core favours fewer threads, which is slower once the machine is quiet.

    Under a deadline, the defaults' first measurement always starts (the reference of the
    profile: when the deadline cuts it, ``result["no_profile"]`` says so and the caller writes
    none); every later measurement starts only when it fits in the time left, as long as its own
    last one; a candidate not re-measured yet, as the others were, or as this run's trials
    (``trial_s``, their median), or as the defaults. A measurement cut by the deadline is dropped,
    the ones before it count."""
    clock = guard.now if guard is not None else time.monotonic
    runs: Dict[int, list] = {t.number: [] for t in cands}
    default_runs: list = []
    took: Dict[Optional[int], float] = {}  # the last measurement's seconds: None for the defaults
    by_number = {t.number: t for t in cands}

    def expected(key) -> float:
        if key in took:
            return took[key]
        others = [v for k, v in took.items() if k is not None]
        return statistics.median(others) if others else (trial_s or took[None])

    def intervals() -> Dict[int, Optional[dict]]:
        return {n: _noise.ratio_interval(v, default_runs) for n, v in runs.items() if v}

    def eligible(n: int, loaded: bool) -> bool:
        return not loaded or _keeps_load_sensitive(_settings_of(by_number[n]), defaults)

    def leader(ivs, loaded: bool) -> Optional[int]:
        ok = [n for n, iv in ivs.items() if iv is not None and eligible(n, loaded)]
        return max(ok, key=lambda n: ivs[n]["ratio"], default=None)

    def run(key, settings, label) -> bool:
        left = guard.remaining() if guard is not None else None
        if left is not None and took and expected(key) > left:
            return False
        what = 'the defaults' if key is None else _describe(by_number[key])
        _notify(callbacks, "phase", f"re-measuring {what} ({label})")
        t0 = clock()
        value = measure(w, settings, device=device)[0]
        took[key] = clock() - t0
        (default_runs if key is None else runs[key]).append(value)
        return True

    order = [(None, defaults)] + [(t.number, _settings_of(t)) for t in cands]
    plan = [item for _ in range(max(1, rounds)) for item in order]
    probe = _noise.LoadProbe().start()
    done_rounds = 0
    try:
        for i, (key, settings) in enumerate(plan):
            if not run(key, settings, f"{i + 1}/{len(plan)}"):
                break
            done_rounds = (i + 1) // len(order)
        else:
            # more rounds of the defaults and the leader while its interval is wide
            while done_rounds < MAX_CONFIRM_ROUNDS:
                lead = leader(intervals(), _machine_loaded(probe.peek()))
                iv = intervals().get(lead) if lead is not None else None
                if iv is None or (iv["half_width_log"] is not None and iv["half_width_log"] <= RATIO_HALF_WIDTH):
                    break
                label = f"extra round {done_rounds + 1}/{MAX_CONFIRM_ROUNDS}"
                if not (run(None, defaults, label) and run(lead, _settings_of(by_number[lead]), label)):
                    break
                done_rounds += 1
    except _guard.DeadlineReached:
        pass
    except Exception as e:  # the re-measurement failing must not lose the study's result
        warnings.warn(f"gnncompile tune: re-measuring the best trials and the defaults failed: {e}")
        return None
    finally:
        load = probe.stop()
    if not default_runs:
        result["no_profile"] = ("the timeout came before the defaults were measured; no profile "
                                "written (it compares the tuned settings with the defaults measured "
                                "in the same run)")
        return None
    is_loaded = _machine_loaded(load)
    ivs = intervals()
    med = {n: statistics.median(v) for n, v in runs.items() if v}
    lead = leader(ivs, is_loaded)
    top = by_number[lead] if lead is not None else None
    result["default"] = statistics.median(default_runs)
    if top is not None:
        result["best"], result["tuned"] = _settings_of(top), med[top.number]
    result["ratio"] = ivs.get(lead) if lead is not None else None
    noise = dict(result.get("noise") or {})
    result["noise"] = dict(noise, confirm=load, loaded=bool(noise.get("loaded")) or is_loaded,
                           default_spread=_noise.spread(default_runs), rounds=done_rounds)
    if is_loaded:
        # trials by number, ablations by name
        result["noise"]["excluded"] = [n if n >= 0 else _describe(by_number[n])
                                       for n in ivs if not eligible(n, True)]
    result["confirm"] = {"tuned": runs[top.number] if top is not None else [], "default": default_runs,
                         "candidates": [_candidate_record(t, runs, med, ivs) for t in cands]}
    return top


def _candidate_record(t: Any, runs: dict, med: dict, ivs: dict) -> Dict[str, Any]:
    """A re-measured candidate, for the result and the profile: a trial (``ablation`` None) or
    an ablation of the best trial (``trial``: that trial's number, ``ablation``: the one setting
    changed from the defaults, ``settings``; no ``trial_value``, it was never a trial)."""
    if isinstance(t, _Ablation):
        return {"trial": t.source.number, "ablation": t.dimension, "settings": _settings_of(t),
                "trial_value": None, "runs": runs[t.number], "median": med.get(t.number),
                "ratio": ivs.get(t.number)}
    return {"trial": t.number, "ablation": None, "trial_value": float(t.value), "runs": runs[t.number],
            "median": med.get(t.number), "ratio": ivs.get(t.number)}


def _write_profile(optuna, study, w: Workload, props: dict, wl: dict, result: dict, best,
                   defaults: Optional[Dict[str, Any]], out, plots: bool,
                   guard: Optional[_guard.RunGuard] = None) -> None:
    """The profile holds the leading candidate when the re-measurement found it faster than the
    defaults with 95% confidence (its ratio's interval above 1), else the defaults: a profile
    never holds settings that were not shown to be faster than the defaults in the same run.
    Without re-measured defaults (``measure_defaults=False``), the best trial."""
    chosen = "best trial"
    s = dict(result["best"])
    iv = result.get("ratio")
    if defaults is not None and result["default"] is not None:
        if result["default"] > result["tuned"]:
            chosen = "defaults (faster than every trial in this run)"
            s = dict(defaults)
        elif not _noise.faster_with_confidence(iv):
            excluded = (result.get("noise") or {}).get("excluded")
            if iv is None and excluded:
                why = (f"the machine was loaded and every candidate re-measured ({excluded}) "
                       "changed the thread count, which a busy core biases")
            elif iv is None:
                why = "no candidate was re-measured against them before the timeout"
            else:
                why = (f"no candidate was faster than them with 95% confidence: ratio {iv['ratio']:.3f}, "
                       f"interval {_fmt_interval(iv)}")
            chosen = f"defaults ({why})"
            s = dict(defaults)
    ablation = None
    if isinstance(best, _Ablation):
        ablation = {"of_trial": best.source.number, "dimension": best.dimension}
        if chosen == "best trial":
            chosen = (f"ablation of trial {best.source.number}: the defaults with only "
                      f"{best.dimension!r} changed")
    result["chosen"], result["ablation"] = chosen, ablation
    s.pop("loader", None)
    counts = {st.name.lower(): 0 for st in optuna.trial.TrialState}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name.lower()] += 1
    doc = _profiles.make(props, wl, s, tuned=result["tuned"], default=result["default"],
                         unit=w.unit, study={"name": result["name"], "storage": _redact(result["storage"]),
                                             "best_trial": getattr(best, "source", best).number,
                                             "trials": counts, "chosen": chosen,
                                             "ablation": ablation,
                                             "ratio": result.get("ratio"),
                                             "noise": result.get("noise"),
                                             "confirm_runs": result.get("confirm"),
                                             "default_settings": _DEFAULTS_LABEL.get(w.kind, "kernel defaults")},
                         extra={"batch_size_rule": batch_size_rule(s, wl),
                                "precision_rule": precision_rule(s, wl)})
    target = _profile_target(out, doc)
    if guard is not None:
        guard.check_interrupt()  # interrupted: no profile (KeyboardInterrupt)
    path, written = save_if_better(doc, target)
    result["profile_path"], result["profile_written"] = path, written
    if not written:
        warnings.warn(f"gnncompile tune: {path} holds a faster result of this study "
                      f"({profile_value(_profiles.read(path)):.4g} {w.unit}); kept it")
        return
    left = guard.remaining() if guard is not None else None
    if plots and (left is None or left > PLOT_RESERVE_S):
        result["plots"] = save_plots(study, path.with_suffix(""))


def _fmt_interval(iv: Dict[str, Any]) -> str:
    if iv.get("low") is None:
        return "unknown (one round of re-measurement fitted)"
    return f"[{iv['low']:.3f}, {iv['high']:.3f}]"


_DEFAULTS_LABEL = {"graphs": "torch_geometric.loader.DataLoader",
                   "neighbor": "gnncompile.data.NeighborLoader defaults (no workers, no prefetch)"}

PLOT_RESERVE_S = 3.0  # plots are skipped when less of the run's timeout is left


def _profile_target(out, doc) -> Path:
    target = Path(out) if out is not None else _profiles.profile_dir()
    return target if target.suffix == ".json" else target / _profiles.default_filename(doc)


def profile_value(doc: Any) -> Optional[float]:
    """The throughput of a profile's settings: its tuned or default throughput, whichever it
    chose (the larger); None when it records neither."""
    tp = doc.get("throughput") if isinstance(doc, dict) else None
    if not isinstance(tp, dict):
        return None
    vals = [float(v) for v in (tp.get("tuned"), tp.get("default"))
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(vals) if vals else None


def save_if_better(doc: Dict[str, Any], target: Path) -> Tuple[Path, bool]:
    """Writes the profile unless ``target`` already holds a faster result of the same study and
    workload (another tuner on the study finished first); returns (path, written). Read, compare
    and write happen under an exclusive lock on ``.<name>.lock`` next to the profile, so that
    tuners finishing together do not overwrite each other's better result; ties go to this run.
    A file of another study, or one that cannot be read, is replaced as before."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            old = _profiles.read(target) if target.exists() else None
        except _profiles.ProfileError:
            old = None
        if (isinstance(old, dict) and isinstance(old.get("study"), dict)
                and old["study"].get("name") == doc["study"]["name"]
                and old.get("workload_signature") == doc["workload_signature"]):
            mine, theirs = profile_value(doc), profile_value(old)
            if theirs is not None and (mine is None or theirs > mine):
                return target, False
        return _profiles.save(doc, target), True


RESERVED_ROUNDS = 2  # rounds of re-measurements the trials' phase leaves time for


class _Budget:
    """The plan of a run with a deadline, on the guard's clock (:meth:`tuner.guard.RunGuard.now`):
    the trials go on while one more trial and two rounds of re-measurements after it fit before
    the deadline; the trials' phase ends there (``guard.limit``: a trial running past it is
    cut). A round is the candidates there will be then (at most ``confirm_top``, 0: no
    re-measurements) and the defaults, each as long as this run's median complete trial. Until a
    trial has completed nothing is known of a measurement's duration: the trials' phase ends
    at the deadline (a first trial that completes late stays in the study, for a longer run to
    resume; the defaults are tried after it). Trials are timed from the end of the one before
    (the sampler, the storage and the callbacks included)."""

    def __init__(self, guard: _guard.RunGuard, confirm_top: int) -> None:
        """Made when the trials start."""
        self.guard = guard
        self.top = max(confirm_top, 0)
        self.trials: list = []  # seconds of this run's trials
        self.complete: list = []  # seconds of this run's complete trials (whole measurements)
        self.last = guard.now()

    def measure_s(self) -> Optional[float]:
        """The median seconds of this run's complete trials (None: none completed)."""
        return statistics.median(self.complete) if self.complete else None

    def reserve(self, candidates: int) -> float:
        """Seconds for ``RESERVED_ROUNDS`` rounds of re-measurements of ``candidates`` trials and
        the defaults (two rounds: the fewest that give a ratio's interval, without which the
        profile keeps the defaults)."""
        if not self.top:
            return 0.0
        return RESERVED_ROUNDS * (min(self.top, candidates) + 1) * statistics.median(self.complete or self.trials)

    def callback(self, study, trial) -> None:
        """An Optuna callback: after each trial, where the trials' phase ends."""
        import optuna

        now = self.guard.now()
        self.trials.append(now - self.last)
        self.last = now
        complete = optuna.trial.TrialState.COMPLETE
        if trial.state == complete:
            self.complete.append(self.trials[-1])
        if self.complete or not self.top:
            done = len(study.get_trials(deepcopy=False, states=(complete,)))
            self.guard.limit = self.guard.deadline - self.reserve(done + 1)
        if now + statistics.median(self.trials) > self.guard.limit:
            study.stop()


def _run_trials(optuna, study, objective, trials: int, guard: _guard.RunGuard, callbacks,
                confirm_top: int = 0) -> Optional[float]:
    """Runs what is missing for the study to hold ``trials`` finished trials, within the
    guard's deadline (keeping time for two rounds of re-measurements of ``confirm_top`` trials and
    the defaults; 0: none, :class:`_Budget`). Returns the median seconds of the complete trials it
    ran under the deadline (None: none)."""
    budget = None
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    finished = [t for t in study.get_trials(deepcopy=False) if t.state in done]
    remaining = max(trials - len(finished), 0)
    cbs = [optuna.study.MaxTrialsCallback(trials, states=done)] + list(callbacks)
    left = guard.remaining()
    if remaining > 0 and (left is None or left > 0):
        if left is not None:
            budget = _Budget(guard, confirm_top)
            cbs.append(budget.callback)
        study.optimize(objective, n_trials=remaining, timeout=left, catch=(Exception,),
                       callbacks=cbs, gc_after_trial=True)
    guard.check_interrupt()  # Ctrl-C between trials
    guard.limit = guard.deadline
    return budget.measure_s() if budget is not None else None


def _check_args(trials: int, timeout: Optional[float], batch_size: Optional[int],
                batch_range: Optional[Tuple[int, int]], out, write_profile: bool) -> None:
    """Arguments that cannot work raise SetupError before anything is opened or measured."""
    if not isinstance(trials, int) or trials < 1:
        raise SetupError(f"trials must be an integer >= 1, got {trials!r}")
    if timeout is not None and not timeout > 0:
        raise SetupError(f"timeout must be > 0 seconds, got {timeout!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise SetupError(f"batch size must be an integer >= 1, got {batch_size!r}")
    if batch_range is not None:
        lo, hi = batch_range
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise SetupError(f"batch range MIN MAX needs integers 1 <= MIN <= MAX, got {lo!r} {hi!r}")
    if write_profile:
        _check_writable(Path(out) if out is not None else _profiles.profile_dir())


def _check_writable(out: Path) -> None:
    """The profile folder exists (or can be made) and takes a file."""
    import tempfile

    folder = out.parent if out.suffix == ".json" else out
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise SetupError(f"cannot write the profile to {folder}: {e.strerror or e}") from None


def tune(w: Workload, trials: int = 20, timeout: Optional[float] = None, storage: Optional[Any] = None,
         out: Optional[os.PathLike] = None, name: Optional[str] = None,
         batch_size: Optional[int] = 128, batch_range: Optional[Tuple[int, int]] = None,
         memory_budget: Optional[int] = None, max_workers: Optional[int] = None, seed: Optional[int] = None,
         measure_defaults: bool = True, write_profile: bool = True, plots: bool = True,
         callbacks: Sequence[Callable] = (), device: Optional[str] = None,
         confirm_rounds: int = 3, confirm_top: int = 3,
         tune_batch_size: Optional[bool] = None) -> Dict[str, Any]:
    """Runs (or resumes) the study for ``w`` and writes its profile. Returns a dict with
    ``study`` (the Optuna study), ``profile_path``, ``best`` (settings), ``tuned``,
    ``default`` (throughputs), ``plots``, ``elapsed_s``, ``compiler_warnings``, and
    ``no_profile`` (why) when the timeout came before the defaults were measured.

    A trial's value is a single, short measurement (identical settings measured 115-155
    epochs/s in five runs of a 5-step workload here; a loader worker that costs 10% measured
    faster than none in one study), so the settings the profile holds, and the tuned and default
    throughputs it records, come from ``confirm_rounds`` rounds that re-measure the
    ``confirm_top`` best trials (distinct settings), the ablations of the best of them (the
    defaults with one of its settings changed, one candidate per setting that differs from the
    defaults; the result's and the profile's ``confirm_runs.candidates`` name them by
    ``ablation``) and the defaults in turn: the highest ratio to the defaults leads, and the
    profile holds it when that ratio is above 1 with confidence (else the defaults).

    ``timeout`` (seconds) bounds the whole call and is used: trials, re-measurements, profile
    and plots (module docstring, "timeout"). Ctrl-C raises KeyboardInterrupt out of this call
    (module docstring, "interrupts"); arguments that cannot work raise SetupError, a storage that
    cannot be opened StorageError, both before anything is measured."""
    _check_args(trials, timeout, batch_size, batch_range, out, write_profile)
    batch_range = batch_search(w, tune_batch_size, batch_range)
    with _guard.RunGuard(timeout) as guard:
        result = _tune(guard, w, trials, storage, out, name, batch_size, batch_range, memory_budget,
                       max_workers, seed, measure_defaults, write_profile, plots, callbacks, device,
                       confirm_rounds, confirm_top)
    result["elapsed_s"] = guard.elapsed()
    result["compiler_warnings"] = guard.compiler_warnings
    return result


def _tune(guard, w, trials, storage, out, name, batch_size, batch_range, memory_budget, max_workers,
          seed, measure_defaults, write_profile, plots, callbacks, device, confirm_rounds, confirm_top):
    optuna = _optuna()
    props = _device.detect(device)
    storage = storage or default_storage()
    name = name or study_name(w, props, batch_size, batch_range)
    wl = workload_dict(w, batch_size, batch_range)
    cpus = int(props.get("logical_cpus") or props.get("host_logical_cpus") or 1)
    if max_workers is None:
        max_workers = min(4, cpus)
    sampler, constrain = _sampler(optuna, trials, seed)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    study = _open_study(optuna, name, storage, sampler, pruner)
    fail_orphans(study)
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    _notify(callbacks, "begin", len(study.get_trials(deepcopy=False, states=finished)))
    study.set_user_attr("workload", wl)
    study.set_user_attr("device_key", _device.device_key(props))
    study.set_user_attr("unit", w.unit)
    objective = _objective(optuna, w, props, constrain, batch_size, batch_range, max_workers,
                           memory_budget, device)
    prepare(w)  # the workload's data, before the first trial is timed
    # time kept for two rounds of re-measurements (more run when they fit)
    with _noise.LoadProbe() as trials_load:
        trial_s = _run_trials(optuna, study, objective, trials, guard, callbacks,
                              max(1, confirm_top) if measure_defaults else 0)

    result: Dict[str, Any] = {"study": study, "profile_path": None, "plots": [], "best": None,
                              "tuned": None, "default": None, "name": name, "storage": storage,
                              "ratio": None, "noise": {"trials": trials_load.report,
                                                       "loaded": _machine_loaded(trials_load.report)}}
    complete = [t for t in study.get_trials(deepcopy=False)
                if t.state == optuna.trial.TrialState.COMPLETE
                and float(t.user_attrs.get("memory_excess", 0.0)) <= 0]
    if not complete:
        warnings.warn("gnncompile tune: no trial completed; no profile written")
        return result
    ranked = sorted(complete, key=lambda t: t.value, reverse=True)
    best = ranked[0]
    result["best"], result["tuned"] = _settings_of(best), float(best.value)
    defaults = None
    if measure_defaults:
        defaults = default_settings(w, props, batch_size=int(batch_size or 128))
        pool = ranked
        if result["noise"]["loaded"]:
            # the trials ran on a loaded machine: the candidates re-measured are the best trials
            # that keep the load-sensitive settings at the defaults' (a busy core makes fewer
            # threads look faster), so that a gain from the other settings can still be shown
            pool = [t for t in ranked if _keeps_load_sensitive(_settings_of(t), defaults)]
            result["noise"]["skipped_trials"] = [t.number for t in ranked if t not in pool][:confirm_top]
        cands = _candidates(pool, confirm_top)
        if cands and confirm_top > 0:
            # the defaults with each single setting of the leading trial (dimensions of a noisy
            # multi-dimension winner that carry no gain may hide the one that does)
            cands = cands + _ablations(cands[0], defaults, cands)
        best = _confirm(w, cands, defaults, confirm_rounds, device, result,
                        guard, trial_s, callbacks) or best
        if result.get("no_profile"):
            warnings.warn(f"gnncompile tune: {result['no_profile']}", NoProfileWarning)
            return result
    if write_profile:
        _write_profile(optuna, study, w, props, wl, result, best, defaults, out, plots, guard)
    return result


def _redact(url: Any) -> str:
    """A storage URL without its password; a storage object (e.g. a JournalStorage passed to
    :func:`tune`) as ``journal:PATH`` when it has a file, else its class name."""
    if not isinstance(url, str):
        path = getattr(getattr(url, "_backend", None), "_file_path", None)
        return f"journal:{path}" if path else type(url).__name__
    if "://" in url and "@" in url.split("://", 1)[1]:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}:***@{host}"
    return url


def save_plots(study, stem: Path) -> list:
    """Optimisation history and parameter importances as PNG (``<stem>.history.png``,
    ``<stem>.importance.png``); a plot that cannot be made (too few trials) is skipped."""
    written = []
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as ovm
    except Exception as e:  # pragma: no cover
        warnings.warn(f"gnncompile tune: no plots ({e})")
        return written
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for suffix, fn in (("history", ovm.plot_optimization_history),
                           ("importance", ovm.plot_param_importances)):
            try:
                ax = fn(study)
                fig = ax.figure if hasattr(ax, "figure") else ax[0].figure
                p = Path(f"{stem}.{suffix}.png")
                # atomically: processes sharing a study finish together and write the same PNG
                try:
                    _profiles.atomic_write(p, lambda f: fig.savefig(f, format="png", dpi=90,
                                                                    bbox_inches="tight"))
                finally:
                    plt.close(fig)
                written.append(p)
            except Exception:
                pass
    return written


__all__ = ["tune", "default_storage", "study_name", "workload_dict", "suggest", "save_plots", "StorageError",
           "SetupError", "NoProfileWarning", "journal_path", "save_if_better", "profile_value"]
