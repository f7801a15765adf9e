"""``python -m pyhpc``: the same CLI as the ``pyhpc`` entry point."""
import sys

from pyhpc.cli.main import main

sys.exit(main())
