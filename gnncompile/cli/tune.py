"""``gnncompile tune``: an Optuna study for this device and a workload, written as a profile.

Imports :mod:`gnncompile.tuner` (the optional extra, needs optuna) only when it runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings


def _cores(report) -> str:
    """Other processes' average CPU use from a load report, for a message."""
    v = (report or {}).get("others_cores")
    return "unknown" if v is None else f"{v:.2f}"


def _arg_type(convert, ok, expected: str, must: str):
    """An argparse type: ``convert(text)``, refused (not replaced) unless ``ok(value)``."""
    def parse(text: str):
        try:
            v = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
        return v
    return parse


_positive_int = _arg_type(int, lambda v: v >= 1, "an integer >= 1", ">= 1")
_positive_float = _arg_type(float, lambda v: v > 0, "a number of seconds", "> 0")
#: a fanout entry: an integer >= 1, or -1 (all neighbors)
_fanout = _arg_type(int, lambda v: v >= 1 or v == -1, "an integer >= 1 or -1", ">= 1 or -1 (all neighbors)")
_fraction = _arg_type(float, lambda v: 0 < v <= 1, "a number in (0, 1]", "in (0, 1]")


#: the batch size when --batch-size is not given
DEFAULT_BATCH = {"graphs": 128, "fullgraph": 128, "neighbor": 1024}

#: exit statuses of ``gnncompile tune``
EXIT_STATUS = ("0: profile written (or a faster one of the study kept); 1: no trial completed, no "
               "profile; 2: bad arguments or storage; 3: the --timeout came before the defaults were "
               "measured, no profile (the trials are kept: run again with a longer --timeout); "
               "130: interrupted (Ctrl-C)")


def add_parser(sub) -> None:
    t = sub.add_parser("tune", help="tune settings for this device and write a profile",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       epilog=f"exit status: {EXIT_STATUS}")
    t.add_argument("--workload", choices=("fullgraph", "graphs", "neighbor"), default="graphs",
                   help="fullgraph: one graph, epochs/s; graphs: many small graphs, graphs/s; neighbor: "
                        "sampled mini-batches of one large graph (gnncompile.data.NeighborLoader), seeds/s")
    t.add_argument("--model", choices=("gcn", "sage", "gin", "gat"), default=None,
                   help="default: sage for neighbor, else gin")
    t.add_argument("--trials", type=_positive_int, default=20, help="finished trials the study should hold")
    t.add_argument("--timeout", type=_positive_float, default=None,
                   help="wall-clock seconds for the whole run, used: trials, re-measurements (the "
                        "defaults always), profile")
    t.add_argument("--storage", default=None,
                   help="Optuna storage URL, or journal:PATH (or a PATH ending in .log/.journal) for "
                        "a journal file (default: SQLite in the cache dir)")
    t.add_argument("--study-name", default=None, help="default: <device key>__<workload signature>")
    t.add_argument("--out", default=None, help="folder for the profile JSON (default: the profile dir)")
    t.add_argument("--batch-size", type=_positive_int, default=None,
                   help="fixed batch size (graphs, default 128); neighbor: the batch size (seed nodes) "
                        "the defaults are measured at (default 1024, as PyG's neighbor-sampling examples)")
    t.add_argument("--tune-batch-size", action="store_true",
                   help="search the batch size too (it changes the optimisation: the profile states "
                        "the learning-rate rescaling that goes with it); in --batch-range, default "
                        "32 512 (graphs), 128 4096 (neighbor)")
    t.add_argument("--batch-range", type=_positive_int, nargs=2, metavar=("MIN", "MAX"), default=None,
                   help="the batch sizes --tune-batch-size searches (implies it)")
    t.add_argument("--memory-budget-mb", type=float, default=None, help="peak memory constraint")
    t.add_argument("--max-workers", type=int, default=None, help="largest num_workers tried")
    t.add_argument("--no-compile", action="store_true", help="train the eager model (no kernel knob)")
    t.add_argument("--allow-bf16", action="store_true",
                   help="also search choices['precision'] = 'bf16' (the fused spmm gathers bfloat16 "
                        "features: an opt-in lower precision, CPU only; the profile may then carry it)")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--layers", type=int, default=None, help="default: one per hop for neighbor, else 3")
    t.add_argument("--num-features", type=int, default=16)
    t.add_argument("--num-nodes", type=_positive_int, default=20000, help="fullgraph, neighbor")
    t.add_argument("--num-edges", type=_positive_int, default=200000, help="fullgraph, neighbor")
    t.add_argument("--fanout", type=_fanout, nargs="+", default=[15, 10], metavar="K",
                   help="neighbor: neighbors sampled per hop (-1: all)")
    t.add_argument("--train-fraction", type=_fraction, default=0.1,
                   help="neighbor: share of the nodes used as training seeds")
    t.add_argument("--ranks", type=_positive_int, default=1,
                   help="neighbor: run each trial as N data-parallel gloo rank processes on this host "
                        "(DDP around the compiled model, each rank its own shard of the seeds, threads "
                        "per rank); the profile records ranks")
    t.add_argument("--num-graphs", type=int, default=20000, help="graphs")
    t.add_argument("--min-nodes", type=int, default=10, help="graphs")
    t.add_argument("--max-nodes", type=int, default=40, help="graphs")
    t.add_argument("--warmup", type=int, default=10, help="steps before timing")
    t.add_argument("--steps", type=int, default=40, help="timed steps per trial")
    t.add_argument("--seed", type=int, default=None, help="sampler seed")
    t.add_argument("--no-defaults", action="store_true",
                   help="do not measure the defaults (nor re-measure the best trials)")
    t.add_argument("--confirm-top", type=int, default=3,
                   help="best trials re-measured against each other and the defaults")
    t.add_argument("--confirm-rounds", type=int, default=3, help="rounds of those re-measurements")
    t.add_argument("--no-progress", action="store_true")



def _progress(total: int, enabled: bool):
    """An Optuna callback drawing a progress bar: trial, best so far, elapsed."""
    start = time.monotonic()
    bar = None
    if enabled:
        try:
            from tqdm import tqdm

            bar = tqdm(total=total, unit="trial", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            bar = None

    def callback(study, trial):
        try:
            best = f"{study.best_value:.4g}"
        except ValueError:
            best = "-"
        state = trial.state.name.lower()
        if bar is not None:
            bar.set_postfix_str(f"trial {trial.number} {state}, best {best}")
            bar.update(1)
        elif enabled:
            print(f"trial {trial.number} {state}: best {best}, {time.monotonic() - start:.0f}s elapsed",
                  file=sys.stderr)

    def begin(finished: int) -> None:
        """The study is open and holds ``finished`` trials already (a resumed study)."""
        if finished <= 0:
            return
        note = (f"{finished} trial(s) already in the study" if finished < total
                else f"the study already holds {finished} trial(s): none to run")
        if bar is not None:
            bar.n = min(finished, total)
            bar.set_postfix_str(note)
            bar.refresh()
        elif enabled:
            print(note, file=sys.stderr)

    def phase(text: str) -> None:
        """Work after the trials (re-measuring the best trials and the defaults)."""
        if bar is not None:
            bar.set_postfix_str(text)
            bar.refresh()
        elif enabled:
            print(f"{text}, {time.monotonic() - start:.0f}s elapsed", file=sys.stderr)

    callback.begin, callback.phase = begin, phase
    callback.close = lambda: bar.close() if bar is not None else None
    return callback


def _workload(Workload, args):
    """The Workload of the arguments (ValueError for one that cannot work)."""
    neighbor = args.workload == "neighbor"
    model = args.model or ("sage" if neighbor else "gin")
    layers = args.layers if args.layers is not None else (len(args.fanout) if neighbor else 3)
    return Workload(kind=args.workload, model=model, hidden=args.hidden, layers=layers,
                    num_features=args.num_features, compiled=not args.no_compile, num_nodes=args.num_nodes,
                    num_edges=args.num_edges, num_graphs=args.num_graphs, min_nodes=args.min_nodes,
                    max_nodes=args.max_nodes, warmup=args.warmup, steps=args.steps,
                    fanout=list(args.fanout), train_fraction=args.train_fraction, ranks=args.ranks,
                    allow_bf16=bool(args.allow_bf16))


def run(args) -> int:
    try:
        from gnncompile.tuner import Workload, tune
        from gnncompile.tuner.study import NoProfileWarning, SetupError, StorageError, _redact
    except ImportError as e:
        print(f"gnncompile tune: {e}", file=sys.stderr)
        return 2
    try:
        w = _workload(Workload, args)
    except ValueError as e:
        print(f"gnncompile tune: {e}", file=sys.stderr)
        return 2
    budget = int(args.memory_budget_mb * 2**20) if args.memory_budget_mb else None
    cb = _progress(args.trials, not args.no_progress)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NoProfileWarning)  # said below, with the exit status
            res = tune(w, trials=args.trials, timeout=args.timeout, storage=args.storage, out=args.out,
                       name=args.study_name, batch_size=args.batch_size or DEFAULT_BATCH[args.workload],
                       batch_range=tuple(args.batch_range) if args.batch_range else None,
                       memory_budget=budget, max_workers=args.max_workers, seed=args.seed,
                       measure_defaults=not args.no_defaults, callbacks=[cb],
                       confirm_top=args.confirm_top, confirm_rounds=args.confirm_rounds,
                       tune_batch_size=True if args.tune_batch_size else None)
    except (StorageError, SetupError) as e:
        print(f"gnncompile tune: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        cb.close()
        print("gnncompile tune: interrupted; completed trials are kept in the study; run the same "
              "command again to resume", file=sys.stderr)
        return 130
    finally:
        cb.close()
    study = res["study"]
    states = {}
    for t in study.get_trials(deepcopy=False):
        states[t.state.name.lower()] = states.get(t.state.name.lower(), 0) + 1
    summary = {"study": res["name"], "storage": _redact(res["storage"]), "trials": states, "best": res["best"],
               "tuned": res["tuned"], "default": res["default"], "unit": w.unit,
               "profile": str(res["profile_path"]) if res["profile_path"] else None,
               "plots": [str(p) for p in res["plots"]]}
    if res["tuned"] and res["default"]:
        summary["speedup"] = res["tuned"] / res["default"]
    summary["elapsed_s"] = round(res["elapsed_s"], 2)
    if res.get("chosen"):
        summary["chosen"] = res["chosen"]
    if res.get("ablation"):
        summary["ablation"] = res["ablation"]
    if res.get("ratio"):
        summary["ratio"] = res["ratio"]
    if res.get("noise"):
        summary["noise"] = res["noise"]
        if res["noise"].get("loaded"):
            print("gnncompile tune: other processes kept the machine busy while this run measured "
                  f"(trials: {_cores(res['noise'].get('trials'))}, re-measurement: "
                  f"{_cores(res['noise'].get('confirm'))} of a core on average); the thread count "
                  "stays at the defaults' and the figures are less certain: tune on a quiet machine",
                  file=sys.stderr)
    if res.get("profile_written") is False:
        summary["profile_kept"] = "the file holds a faster result of this study; left as it was"
    if res.get("no_profile"):
        summary["no_profile"] = res["no_profile"]
    if res["compiler_warnings"]:
        print(f"gnncompile tune: {res['compiler_warnings']} warnings of torch's compiler (graph breaks, "
              "recompilations) during the run; set the 'gnncompile.tuner' logger to DEBUG to see them",
              file=sys.stderr)
    print(json.dumps(summary, indent=2))
    if res.get("no_profile"):
        print(f"gnncompile tune: {res['no_profile']}; the trials are kept in the study: run the same "
              "command with a longer --timeout to resume", file=sys.stderr)
        return 3
    return 0 if res["profile_path"] else 1
