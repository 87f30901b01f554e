"""gnncompile.tuner: offline Optuna search for per-device profiles (optional extra).

Installed as ``gnncompile.tuner`` (the folder sits at the top of the repository); nothing in
gnncompile imports it. ``tune(Workload(...), trials=..., timeout=...)`` runs or resumes a study
and writes a profile (:mod:`gnncompile.profiles`); ``gnncompile tune`` is its command line.
"""
from .workloads import KINDS, MODELS, Workload, measure  # noqa: F401
from .study import default_storage, study_name, tune  # noqa: F401

__all__ = ["Workload", "measure", "tune", "default_storage", "study_name", "MODELS", "KINDS"]
