"""``gnncompile export MODEL -i DTYPE:SHAPE ... -o FILE``: the optimized graph of a model as
ONNX or a torch.export program (:func:`gnncompile.export`)."""
from __future__ import annotations

import json
import sys

from ._model_args import add_model_arguments, model_and_inputs


def run(args) -> int:
    import gnncompile
    from gnncompile.export import ExportError

    loaded = model_and_inputs(args, "gnncompile export")
    if loaded is None:
        return 2
    model, inputs = loaded
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
    add_model_arguments(ex, "capture")
    ex.add_argument("--output", "-o", required=True, help="file to write (.onnx or .pt2)")
    ex.add_argument("--format", choices=("onnx", "pt2"), default=None,
                    help="default: from the output's extension (.pt2 -> pt2, else onnx)")
    ex.add_argument("--static", action="store_true", help="fix the example's numbers of nodes and edges")
