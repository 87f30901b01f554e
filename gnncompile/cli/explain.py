"""``gnncompile explain MODEL -i DTYPE:SHAPE ...``: what the passes fuse in a model, what they
leave and why, and where Dynamo breaks the graph (:func:`gnncompile.explain`)."""
from __future__ import annotations

import json

from ._model_args import add_model_arguments, model_and_inputs


def run(args) -> int:
    import gnncompile

    loaded = model_and_inputs(args, "gnncompile explain")
    if loaded is None:
        return 2
    model, inputs = loaded
    report = gnncompile.explain(model, *inputs)
    print(json.dumps(report.as_dict(), indent=2) if args.json else str(report))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "explain", help="what fuses in a model, what does not and why, and its graph breaks",
        description="Runs MODEL once through Dynamo with the gnncompile passes on random inputs "
                    "of the given shapes and prints what fused, what was left unfused (with "
                    "the reason) and the graph breaks.")
    add_model_arguments(p, "run")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
