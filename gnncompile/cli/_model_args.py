"""What ``gnncompile export`` and ``gnncompile explain`` share: the model reference
(``package.module:attr`` or a ``torch.save`` file) and random example inputs given as
``-i DTYPE:SHAPE``."""
from __future__ import annotations

import argparse
import sys

from .._log import error_line

_DTYPES = {"float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
           "int64": "int64", "long": "int64", "int32": "int32", "int": "int32"}


def parse_input(spec: str):
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


def example_inputs(specs, seed: int = 0):
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
    """MODEL cannot be loaded: the subcommand reports it in one line and exits with status 2."""


def load_model(ref: str):
    """'package.module:attr' (an nn.Module, or a callable returning one) or a file saved with
    torch.save(model). Raises ModelLoadError saying which step failed."""
    import importlib
    import os

    import torch

    if os.path.exists(ref):
        try:
            obj = torch.load(ref, weights_only=False)
        except Exception as e:
            raise ModelLoadError(f"cannot load {ref}: {error_line(e)}") from None
    elif ":" not in ref:
        raise ModelLoadError(f"{ref!r} is neither a file nor 'module:attr'")
    else:
        mod_name, attr = ref.split(":", 1)
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # a module in the current folder, as `python -m` finds it
        try:
            obj = importlib.import_module(mod_name)
        except Exception as e:  # ImportError, or whatever the module raises while it imports
            raise ModelLoadError(f"cannot import {mod_name!r}: {error_line(e)}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ModelLoadError(f"{mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if not isinstance(obj, torch.nn.Module) and callable(obj):
            try:
                obj = obj()
            except Exception as e:
                raise ModelLoadError(f"{ref}() raised {error_line(e)}") from None
    if not isinstance(obj, torch.nn.Module):
        raise ModelLoadError(f"{ref} is not an nn.Module (nor returns one): got {type(obj).__name__}")
    return obj


def add_model_arguments(p, action: str) -> None:
    """The MODEL positional and the -i / --seed options (``action``: what is done to it)."""
    p.add_argument("model", help="'package.module:attr' (an nn.Module or a callable returning "
                                 "one) or a file written by torch.save(model)")
    p.add_argument("--input", "-i", action="append", type=parse_input, required=True,
                   metavar="DTYPE:SHAPE",
                   help=f"one example input to {action} the model on, in call order, "
                        "e.g. -i float32:100,16 -i int64:2,400")
    p.add_argument("--seed", type=int, default=0, help="seed of the random example inputs")


def model_and_inputs(args, prog: str):
    """The model and example inputs that ``args`` (from :func:`add_model_arguments`) describe,
    or None after printing one line ``prog: reason`` when the model cannot be loaded."""
    try:
        model = load_model(args.model)
    except ModelLoadError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    inputs = example_inputs(args.input, args.seed)
    import torch

    try:  # the model as written on these inputs first: a wrong shape is the user's to fix
        with torch.no_grad():
            model(*inputs)
    except Exception as e:
        shapes = " ".join(f"-i {str(t.dtype).replace('torch.', '')}:{','.join(map(str, t.shape))}" for t in inputs)
        print(f"{prog}: {args.model} fails on the example inputs ({shapes}), before any compiling: "
              f"{error_line(e)}", file=sys.stderr)
        return None
    return model, inputs
