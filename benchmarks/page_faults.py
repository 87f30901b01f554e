"""Page faults of a compiled training step under the allocator settings (gnncompile.hardware.memory).

    python -m benchmarks page_faults              # GCN, GraphSAGE, GIN at 100k nodes / 1M edges
    python -m benchmarks page_faults --quick      # GCN at 20k nodes / 200k edges, one round
    python -m benchmarks page_faults --settings auto:off,auto:auto   # the block cache off / on

glibc maps every allocation above its mmap threshold (at most 32 MB) afresh and unmaps it when it
is freed, so a training step on a large graph faults its large tensors in again on every step,
4 KB at a time. ``choices['huge_pages'] = 'auto'`` (default) marks the whole 2 MB pages inside
torch's allocations of >= 2 MiB for transparent huge pages; ``choices['buffer_cache'] = 'auto'``
(default) keeps freed allocations of >= 256 KiB for reuse (capped; 2 MiB before small_steps_cache_s56a.md), so that a step's large tensors
are not mapped and faulted in again; 'off' leaves torch's allocator as it is. A setting is
``HUGE:CACHE`` (``--settings``, default ``off:off,auto:off,auto:auto``: torch as it is, huge
pages alone, both; the first is the reference of the ratio column). One training step (forward, cross-entropy, backward, Adam) of a compiled
2-layer model (hidden 128, F = 128, power-law graph of average degree 10), each setting in
fresh processes under the default allocator (no MALLOC_* variables: what a user's process
does), the settings alternating process by process over --rounds rounds (their order reversed
every other round). Each process steps until the speed guard has decided, then measures
--repeats steps: wall time, minor page faults and system (kernel) CPU time per step (getrusage),
the block cache's hits and misses per step, and the peak resident size. Reports medians over all
steps of a setting and the ratio of the first setting's step time to each.

Writes benchmarks/results/page_faults[_quick].{json,md} (--name: another name).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import warnings

from . import _common

MODELS = ("GCN", "GraphSAGE", "GIN")
SETTINGS = ("off:off", "auto:off", "auto:auto")  # huge_pages:buffer_cache


def parse_setting(text: str):
    """``'HUGE:CACHE'`` -> (huge_pages, buffer_cache) choices; a bare ``'HUGE'`` (the form before
    the block cache) means the cache off. ValueError for anything else."""
    from gnncompile import config

    huge, _, cache = text.partition(":")
    if huge not in config.HUGE_PAGE_MODES:
        raise ValueError(f"setting {text!r}: huge pages must be one of {config.HUGE_PAGE_MODES}")
    return huge, config.buffer_cache_value(f"setting {text!r}: buffer cache", cache or "off", error=ValueError)


def child(model_name: str, nodes: int, huge: str, repeats: int, threads: int, cache="off") -> dict:
    import torch
    from torch_geometric.nn import models

    import gnncompile
    from gnncompile.data.synthetic import power_law_graph

    torch.set_num_threads(threads)
    F = 128
    ei = power_law_graph(nodes, nodes * 10, seed=0)
    torch.manual_seed(0)
    x, y = torch.randn(nodes, F), torch.randint(0, 16, (nodes,))
    model = getattr(models, model_name)(F, 128, 2, 16)
    run = gnncompile.compile(model, settings={"choices": {"huge_pages": huge, "buffer_cache": cache}})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(run(x, ei), y)
        loss.backward()
        opt.step()
        return loss.detach()

    first_loss = float(step())
    _common.step_past_guard(run, step)  # until the speed guard has decided (the whole model, training)
    from gnncompile.hardware import memory

    rows = []
    for _ in range(repeats):
        s0 = memory.status()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step()
        t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        s1 = memory.status()
        rows.append({"wall_s": t1 - t0, "minflt": r1.ru_minflt - r0.ru_minflt, "sys_s": r1.ru_stime - r0.ru_stime,
                     "user_s": r1.ru_utime - r0.ru_utime,
                     "cache_hits": s1.get("cache_hits", 0) - s0.get("cache_hits", 0),
                     "cache_misses": s1.get("cache_misses", 0) - s0.get("cache_misses", 0)})
    st = memory.status()
    return {"rows": rows, "first_loss": first_loss, "huge_pages": run.gnncompile_huge_pages,
            "buffer_cache": getattr(run, "gnncompile_buffer_cache", "n/a"),
            "advised_bytes": st.get("advised_bytes", 0), "cache_held_bytes": st.get("cache_held", 0),
            "cache_held_peak_bytes": st.get("cache_held_peak", 0),
            "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run(opts) -> dict:
    models = opts.models.split(",")
    settings = opts.settings
    res = {m: {s: [] for s in settings} for m in models}
    for r in range(opts.rounds):
        for m in models:
            for s in (settings if r % 2 == 0 else settings[::-1]):
                huge, cache = parse_setting(s)
                cmd = _common.module_command("page_faults") + [
                    "--child", "--model", m, "--nodes", str(opts.nodes), "--huge", huge, "--cache", str(cache),
                    "--repeats", str(opts.repeats), "--threads", str(opts.threads)]
                out = _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout)
                res[m][s].append(out)
                med = (f"{statistics.median(x['wall_s'] for x in out['rows']) * 1e3:.1f} ms, "
                       f"{statistics.median(x['minflt'] for x in out['rows']):.0f} faults"
                       if "rows" in out else out.get("error"))
                print(f"round {r + 1}/{opts.rounds} {m:10s} huge:cache={s:9s}: {med}", flush=True)
    return res


def summary(runs: list) -> dict:
    ok = [r for r in runs if "rows" in r]
    if not ok:
        return {"error": "; ".join(r.get("error", "?") for r in runs)}
    rows = [x for r in ok for x in r["rows"]]

    def med(k):
        return statistics.median(x[k] for x in rows)

    return {"wall_s": med("wall_s"), "minflt": med("minflt"), "sys_s": med("sys_s"), "user_s": med("user_s"),
            "cache_hits": statistics.median(x.get("cache_hits", 0) for x in rows),
            "cache_misses": statistics.median(x.get("cache_misses", 0) for x in rows),
            "cache_held_peak_bytes": max(r.get("cache_held_peak_bytes", 0) for r in ok),
            "maxrss_bytes": max(r["maxrss_bytes"] for r in ok), "huge_pages": ok[0]["huge_pages"],
            "buffer_cache": ok[0].get("buffer_cache", "n/a"),
            "first_losses": sorted({r["first_loss"] for r in ok}), "processes": len(ok), "steps": len(rows)}


def markdown(p: dict) -> str:
    lines = ["| model | huge pages : buffer cache | step ms | minor faults / step | system ms / step | "
             "user ms / step | cache hits / misses per step | peak RSS MiB | cache idle peak MiB | "
             "speed-up over the first |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m, by in p["summary"].items():
        ref = next(iter(by.values()), {})
        for i, (s, d) in enumerate(by.items()):
            if "error" in d:
                lines.append(f"| {m} | {s} | error: {d['error'][:120]} | | | | | | | |")
                continue
            ratio = f"{ref['wall_s'] / d['wall_s']:.2f}x" if i and "wall_s" in ref else ""
            lines.append(f"| {m} | {s} | {d['wall_s'] * 1e3:.1f} | {d['minflt']:.0f} | {d['sys_s'] * 1e3:.1f} | "
                         f"{d['user_s'] * 1e3:.1f} | {d.get('cache_hits', 0):.0f} / {d.get('cache_misses', 0):.0f} | "
                         f"{d['maxrss_bytes'] / 2**20:.0f} | {d.get('cache_held_peak_bytes', 0) / 2**20:.0f} | {ratio} |")
    mach = p["machine"]
    lines += ["", f"{p['nodes']} nodes, {p['nodes'] * 10} edges (power law), F = 128, {p['threads']} threads, "
              f"{p['rounds']} round(s) of fresh processes per setting, {p['repeats']} timed steps each; "
              f"medians over all timed steps of a setting. THP mode: {p['thp_mode']}. CPU: {mach.get('cpu')}; "
              f"torch {mach.get('torch')}. A setting is huge_pages : buffer_cache; 'auto:auto' is the default. "
              f"First losses (every process's first step, before any optimizer step): "
              f"{_losses_text(p)}.",
              _common.load_text(p["loadavg_before_after"]), "", f"Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def _losses_text(p: dict) -> str:
    """Whether every setting's processes had the same first loss, per model."""
    out = []
    for m, by in p["summary"].items():
        losses = {v for d in by.values() if "first_losses" in d for v in d["first_losses"]}
        out.append(f"{m} {'bit-equal across settings' if len(losses) == 1 else 'DIFFER: ' + str(sorted(losses))}")
    return "; ".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--models", default=None)
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--name", default=None, help="result file name (default page_faults[_quick])")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help="comma list of HUGE:CACHE settings (huge pages auto/off, buffer cache auto/off/MiB); "
                         "the first is the reference of the speed-up column")
    ap.add_argument("--huge", choices=("auto", "off"), help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="off", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.child:
        cache = parse_setting(f"{opts.huge}:{opts.cache}")[1]
        print("RESULT " + json.dumps(child(opts.model, opts.nodes, opts.huge, opts.repeats, opts.threads, cache)))
        return
    opts.settings = [s for s in opts.settings.split(",") if s]
    for s in opts.settings:
        try:
            parse_setting(s)
        except ValueError as e:
            ap.error(f"--settings: {e}")
    opts.models = opts.models or ("GCN" if opts.quick else ",".join(MODELS))
    opts.nodes = opts.nodes or (20_000 if opts.quick else 100_000)
    opts.rounds = opts.rounds or (1 if opts.quick else 2)
    opts.repeats = opts.repeats or (3 if opts.quick else 8)
    from gnncompile.hardware import memory

    p = {"machine": {**_common.machine(), "cpu": _common.cpu_model()}, "nodes": opts.nodes, "threads": opts.threads, "rounds": opts.rounds,
         "repeats": opts.repeats, "thp_mode": memory.thp_mode(), "settings": opts.settings,
         "cache_cap_auto_bytes": memory.default_cache_cap()}
    before = _common.loadavg()
    p["runs"] = run(opts)
    p["summary"] = {m: {s: summary(runs) for s, runs in by.items()} for m, by in p["runs"].items()}
    p["loadavg_before_after"] = [before, _common.loadavg()]
    p["command"] = _common.command("page_faults", argv)
    _common.write_results(_common.RESULTS, opts.name or ("page_faults_quick" if opts.quick else "page_faults"),
                          p, markdown)


if __name__ == "__main__":
    main()
