"""``gnncompile info``: versions, native kernels and the detected device, as JSON."""
from __future__ import annotations

import json


def add_parser(sub) -> None:
    sub.add_parser("info", help="versions, native kernels and the detected device, as JSON")


def run(args) -> int:
    import gnncompile

    print(json.dumps(gnncompile.info(), indent=2))
    return 0
