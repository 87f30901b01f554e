"""What ``gnncompile export`` and ``gnncompile explain`` share: the model reference
(``package.module:attr`` or a ``torch.save`` file) and random example inputs given as
``-i DTYPE:SHAPE``."""
from __future__ import annotations

import argparse

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


def load_model(ref: str, prog: str = "gnncompile"):
    """'package.module:attr' (an nn.Module, or a callable returning one) or a file saved with
    torch.save(model). ``prog`` names the subcommand in the error messages."""
    import importlib
    import os

    import torch

    if os.path.exists(ref):
        return torch.load(ref, weights_only=False)
    if ":" not in ref:
        raise SystemExit(f"{prog}: {ref!r} is neither a file nor 'module:attr'")
    mod_name, attr = ref.split(":", 1)
    obj = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, torch.nn.Module) and callable(obj):
        obj = obj()
    if not isinstance(obj, torch.nn.Module):
        raise SystemExit(f"{prog}: {ref} is not an nn.Module (nor returns one)")
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
    """The model and example inputs that ``args`` (from :func:`add_model_arguments`) describe."""
    return load_model(args.model, prog), example_inputs(args.input, args.seed)
