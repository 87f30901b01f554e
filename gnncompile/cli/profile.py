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

    from gnncompile.hardware import device, profiles

    if args.profile_cmd == "list":
        key = device.device_key()
        paths = profiles.list_profiles(args.dir)
        if not paths:
            print(f"no profiles in {args.dir or profiles.profile_dir()}")
        for p in paths:
            try:
                doc = profiles.read(p)
                wl = doc.get("workload", {})
                tp = doc.get("throughput", {})
                mark = "*" if doc.get("device_key") == key else " "
                sp = f"{tp['speedup']:.2f}x" if tp.get("speedup") else "-"
                print(f"{mark} {p}  {wl.get('kind', '?')}/{wl.get('model', '?')}  speedup {sp}")
            except profiles.ProfileError as e:
                print(f"! {p}  {e}")
        print(f"(* = this device: {key})")
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
