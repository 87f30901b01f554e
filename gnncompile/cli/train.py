"""``gnncompile train``: :mod:`gnncompile.train` (a compiled GraphSAGE on sampled batches, in one
process or as every rank of a ``torchrun`` job) as a subcommand."""
from __future__ import annotations


def add_parser(sub) -> None:
    from .. import train

    p = sub.add_parser("train", help="train a compiled GraphSAGE on sampled batches (one process or torchrun)",
                       description=train.__doc__.split("\n\n")[0])
    train.parser(p)


def run(args) -> int:
    from .. import train

    return train.main(args=args, prog="gnncompile train")
