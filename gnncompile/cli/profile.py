"""``gnncompile profile list|show|check-transfer``: the device profiles in a folder, one of them,
or the check of the profile this device would take from the nearest device class
(:mod:`gnncompile.transfer`)."""
from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="list or show device profiles")
    psub = p.add_subparsers(dest="profile_cmd", required=True)
    pl = psub.add_parser("list", help="profiles in the profile folder")
    pl.add_argument("--dir", default=None)
    ps = psub.add_parser("show", help="print a profile (a path, or 'auto' for this device)")
    ps.add_argument("what", nargs="?", default="auto")
    ps.add_argument("--dir", default=None)
    pc = psub.add_parser("check-transfer",
                         help="A/B the profile of the nearest device class against this device's defaults "
                              "and cache the verdict (compile(profile='auto') uses it)")
    pc.add_argument("--dir", default=None, help="profile folder (default: the profile dir)")
    pc.add_argument("--source", default=None,
                    help="the profile file to check (default: the one find() would transfer)")
    pc.add_argument("--workload", default=None,
                    help="JSON workload to pick the nearest profile by, e.g. '{\"kind\": \"graphs\"}'")
    pc.add_argument("--device", default=None, choices=("cpu", "cuda"))
    pc.add_argument("--force", action="store_true", help="measure again even if a verdict is cached")
    pc.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: transfer.ROUNDS)")
    pc.add_argument("--steps", type=int, default=None, help="steps per side per round (default: transfer.STEPS)")
    pc.add_argument("--json", action="store_true", help="print the verdict as JSON")


def run(args) -> int:
    if args.profile_cmd == "check-transfer":
        return _check_transfer(args)
    import warnings

    from gnncompile import profiles

    from gnncompile.hardware import device

    if args.profile_cmd == "list":
        key = device.device_key()
        paths = profiles.list_profiles(args.dir)
        if not paths:
            print(f"no profiles in {args.dir or profiles.profile_dir()}")
        bad = 0
        for p in paths:
            line = _list_line(profiles, p, key)
            bad += line.startswith("!")
            print(line)
        print(f"(* = this device: {key}" + (f"; ! = unreadable: {bad})" if bad else ")"))
        return 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a transfer is shown with its cached verdict: showing never runs the check
        prof = profiles.resolve(args.what, directory=args.dir, check="cached") if args.what == "auto" else \
            profiles.resolve(args.what, check="cached")
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    if prof.source == "transfer":
        doc = {"source": prof.label, "device_key": prof.device_key, "settings": prof.settings,
               "transfer": prof.transfer, "source_profile": prof.raw}
    else:
        doc = prof.raw or {"source": "defaults (gnncompile.hardware.default_settings)",
                           "device_key": prof.device_key, "device": prof.device, "settings": prof.settings}
        if prof.transfer:
            doc = dict(doc, source=prof.label, transfer=prof.transfer)
    print(json.dumps(doc, indent=2))
    return 0


def _list_line(profiles, path, key: str) -> str:
    """One line of ``profile list``; a file that is not a profile is marked ``!`` with the reason
    (the others are still listed)."""
    try:
        doc = profiles.read(path)
    except profiles.ProfileError as e:
        return f"! {path}  {e}"
    if not isinstance(doc, dict) or doc.get("format") != profiles.FORMAT:
        return f"! {path}  corrupt: not a gnncompile profile (no 'format': {profiles.FORMAT!r})"
    wl, tp = doc.get("workload"), doc.get("throughput")
    wl, tp = (wl if isinstance(wl, dict) else {}), (tp if isinstance(tp, dict) else {})
    mark = "*" if doc.get("device_key") == key else " "
    sp = tp.get("speedup")
    sp = f"{sp:.2f}x" if isinstance(sp, (int, float)) and not isinstance(sp, bool) else "-"
    return f"{mark} {path}  {wl.get('kind', '?')}/{wl.get('model', '?')}  speedup {sp}"


def _check_transfer(args) -> int:
    """Exit 0: a verdict (accepted or rejected) is cached and printed; 1: nothing to check (this
    device has a profile of its own, or no profile of its class exists); 2: bad arguments."""
    from gnncompile import profiles, transfer
    from gnncompile.hardware import device

    for name in ("rounds", "steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            print(f"error: --{name} must be >= 1, got {v}", file=sys.stderr)
            return 2
    try:
        workload = json.loads(args.workload) if args.workload else None
    except ValueError as e:
        print(f"error: --workload is not JSON: {e}", file=sys.stderr)
        return 2
    if workload is not None and not isinstance(workload, dict):
        print("error: --workload must be a JSON object", file=sys.stderr)
        return 2
    props = device.detect(args.device)
    if args.source:
        try:
            cand = profiles.transfer_profile(profiles.read(args.source), args.source, props)
        except profiles.ProfileError as e:
            print(f"error: {args.source}: {e}", file=sys.stderr)
            return 2
        if cand.transfer["from"] == cand.device_key:
            print(f"{args.source} is this device's own profile: nothing to transfer", file=sys.stderr)
            return 1
    else:
        found = profiles.find(workload, props, args.dir)
        if found is None or found.source != "transfer":
            what = "has a profile of its own" if found is not None else "has no profile of its class to take"
            print(f"{device.device_key(props)} {what}: nothing to check", file=sys.stderr)
            return 1
        cand = found
    kw = {k: getattr(args, k) for k in ("rounds", "steps") if getattr(args, k) is not None}
    v = transfer.check(cand, props, force=args.force, device=args.device, **kw)
    if args.json:
        print(json.dumps(v, indent=2))
    else:
        print(transfer.apply_verdict(cand, v, props).label)
        print(f"verdict: {transfer.verdict_path(cand)}")
    return 0
