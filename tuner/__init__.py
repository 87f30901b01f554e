"""gnncompile.tuner: offline Optuna search for per-device profiles (optional extra).

Installed as ``gnncompile.tuner`` (the folder sits at the top of the repository); nothing in
gnncompile imports it.
"""
