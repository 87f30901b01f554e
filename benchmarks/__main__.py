"""The benchmarks' runner.

    python -m benchmarks                  # lists the benchmarks, one line each
    python -m benchmarks NAME [ARGS]      # runs one: python -m benchmarks ops --quick

``python -m benchmarks NAME --help`` shows a benchmark's options. Run from the repository root.
"""
from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent


def _summary(doc: str) -> str:
    """A docstring's first sentence (its first paragraph up to '. ' before a capital)."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z])", para)[0]


def benchmarks() -> Dict[str, str]:
    """Every benchmark module of the package (not ``_common``) and its one-line description,
    read from the source without importing it."""
    out = {}
    for path in sorted(HERE.glob("*.py")):
        if not path.name.startswith("_"):
            out[path.stem] = _summary(ast.get_docstring(ast.parse(path.read_text())) or "")
    return out


def _list(file=None) -> None:
    file = file or sys.stdout
    names = benchmarks()
    width = max(map(len, names))
    print("usage: python -m benchmarks NAME [ARGS]   (NAME --help: its options)\n", file=file)
    for name, line in names.items():
        print(f"  {name:<{width}}  {line}", file=file)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        _list()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in benchmarks():
        print(f"python -m benchmarks: no benchmark named {name!r}\n", file=sys.stderr)
        _list(sys.stderr)
        return 2
    sys.argv = [f"python -m benchmarks {name}"] + rest  # argparse's prog, and for code that reads argv
    rc = importlib.import_module(f"{__package__ or 'benchmarks'}.{name}").main(rest)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
