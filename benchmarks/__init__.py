"""gnncompile's benchmarks, one module each; run from the repository root:

    python -m benchmarks                  # the list, one line each
    python -m benchmarks NAME [ARGS]      # one of them (the same as python -m benchmarks.NAME)

Shared helpers are in ``benchmarks._common``; results go to benchmarks/results/ (see its
README.md)."""
