"""``gnncompile profile list|show``: the device profiles in a folder, or one of them."""
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


def run(args) -> int:
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
        prof = profiles.resolve(args.what, directory=args.dir) if args.what == "auto" else \
            profiles.resolve(args.what)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    doc = prof.raw or {"source": "defaults (gnncompile.hardware.default_settings)",
                       "device_key": prof.device_key, "device": prof.device, "settings": prof.settings}
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
