"""The `gnncompile` command line."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gnncompile", description="Fused PyG message passing.")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="versions, native kernels and the detected device, as JSON")
    args = p.parse_args(argv)
    if args.cmd == "info":
        import gnncompile

        print(json.dumps(gnncompile.info(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
