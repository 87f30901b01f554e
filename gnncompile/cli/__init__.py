"""The ``gnncompile`` command line: one module per subcommand, each with ``add_parser(sub)``
and ``run(args) -> exit status``.

    gnncompile info                      versions, native kernels, the detected device (JSON)
    gnncompile demo                      the main job of `make demo`
    gnncompile export MODEL -i ... -o F  ONNX / torch.export of the optimized graph
    gnncompile explain MODEL -i ...      what fuses, what does not and why, graph breaks
    gnncompile tune ...                  an Optuna study, written as a device profile
    gnncompile profile list|show         the device profiles
    gnncompile profile check-transfer    A/B the nearest device class's profile on this device
    gnncompile train ...                 a compiled GraphSAGE on sampled batches (one process or torchrun)
"""
from __future__ import annotations

import argparse

from . import demo, explain, export, info, profile, train, tune

COMMANDS = {"info": info, "demo": demo, "export": export, "tune": tune, "profile": profile}
COMMANDS["explain"] = explain
COMMANDS["train"] = train


def parser() -> argparse.ArgumentParser:
    """The command line's parser (every subcommand)."""
    p = argparse.ArgumentParser(prog="gnncompile", description="Fused PyG message passing.")
    sub = p.add_subparsers(dest="cmd", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return COMMANDS[args.cmd].run(args)
