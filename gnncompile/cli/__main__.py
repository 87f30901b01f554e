"""``python -m gnncompile.cli ...`` runs the ``gnncompile`` command."""
import sys

from . import main

sys.exit(main())
