"""``python -P -m pyhpc.container_run``: the name job scripts start container tasks by
(rendered job lines, the README and researchers' scripts use it); the code is
:mod:`pyhpc.containers.run`."""
import sys

from pyhpc.containers.run import main

if __name__ == "__main__":
    sys.exit(main())
