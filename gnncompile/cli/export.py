"""``gnncompile export MODEL -i DTYPE:SHAPE ... -o FILE``: the optimized graph of a model as
ONNX or a torch.export program (:func:`gnncompile.export`)."""
from __future__ import annotations

import argparse
import json
import sys

_DTYPES = {"float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
           "int64": "int64", "long": "int64", "int32": "int32", "int": "int32"}


def _parse_input(spec: str):
    """'float32:100,16' or 'int64:2,400' -> (dtype name, shape)."""
    try:
        dtype, shape = spec.split(":", 1)
        dims = tuple(int(d) for d in shape.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad input spec {spec!r}; expected DTYPE:D0,D1,... "
                                         "(e.g. float32:100,16 or int64:2,400)")
    if dtype not in _DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {dtype!r} in {spec!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype], dims


def _example_inputs(specs, seed: int = 0):
    """Random tensors of the given shapes: floats ~ N(0, 1); integer tensors hold node indices
    below the first input's dim 0 (the number of nodes)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    num_nodes = next((s[0] for d, s in specs if d.startswith("float") and s), None)
    out = []
    for dtype, shape in specs:
        dt = getattr(torch, dtype)
        if dt.is_floating_point:
            out.append(torch.randn(shape, generator=g, dtype=dt))
        else:
            hi = num_nodes or 2
            out.append(torch.randint(0, hi, shape, generator=g, dtype=dt))
    return tuple(out)


class ModelLoadError(Exception):
    """MODEL cannot be loaded: reported in one line, exit status 2."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _load_model(ref: str):
    """'package.module:attr' (an nn.Module, or a callable returning one) or a file saved with
    torch.save(model). Raises ModelLoadError saying which step failed."""
    import importlib
    import os

    import torch

    if os.path.exists(ref):
        try:
            obj = torch.load(ref, weights_only=False)
        except Exception as e:
            raise ModelLoadError(f"cannot load {ref}: {_first_line(e)}") from None
    elif ":" not in ref:
        raise ModelLoadError(f"{ref!r} is neither a file nor 'module:attr'")
    else:
        mod_name, attr = ref.split(":", 1)
        try:
            obj = importlib.import_module(mod_name)
        except Exception as e:  # ImportError, or whatever the module raises while it imports
            raise ModelLoadError(f"cannot import {mod_name!r}: {_first_line(e)}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ModelLoadError(f"{mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not isinstance(obj, torch.nn.Module) and callable(obj):
            try:
                obj = obj()
            except Exception as e:
                raise ModelLoadError(f"{ref}() raised {_first_line(e)}") from None
    if not isinstance(obj, torch.nn.Module):
        raise ModelLoadError(f"{ref} is not an nn.Module (nor returns one): got {type(obj).__name__}")
    return obj


def run(args) -> int:
    import gnncompile
    from gnncompile.export import ExportError

    try:
        model = _load_model(args.model)
    except ModelLoadError as e:
        print(f"gnncompile export: {e}", file=sys.stderr)
        return 2
    inputs = _example_inputs(args.input, args.seed)
    fmt = args.format or ("pt2" if args.output.endswith(".pt2") else "onnx")
    try:
        res = gnncompile.export(model, inputs, args.output, format=fmt, dynamic=not args.static)
    except ExportError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(json.dumps({
        "path": res.path, "format": res.format, "bytes": res.size_bytes,
        "fused": [str(f) for f in res.fused if f.kind != "degree"],
        "unfused": [str(u) for u in res.unfused],
        "onnx_functions": res.onnx_functions,
    }, indent=2))
    return 0


def add_parser(sub) -> None:
    ex = sub.add_parser(
        "export", help="export the optimized graph of a model as ONNX or a torch.export program",
        description="Captures MODEL on random inputs of the given shapes, fuses its message "
                    "passing and writes it as ONNX (fused ops = functions of the 'gnncompile' "
                    "domain) or as a torch.export program (.pt2). Numbers of nodes and edges "
                    "stay dynamic unless --static.")
    ex.add_argument("model", help="'package.module:attr' (an nn.Module or a callable returning "
                                  "one) or a file written by torch.save(model)")
    ex.add_argument("--input", "-i", action="append", type=_parse_input, required=True,
                    metavar="DTYPE:SHAPE",
                    help="one example input, in call order, e.g. -i float32:100,16 -i int64:2,400")
    ex.add_argument("--output", "-o", required=True, help="file to write (.onnx or .pt2)")
    ex.add_argument("--format", choices=("onnx", "pt2"), default=None,
                    help="default: from the output's extension (.pt2 -> pt2, else onnx)")
    ex.add_argument("--static", action="store_true", help="fix the example's numbers of nodes and edges")
    ex.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")
