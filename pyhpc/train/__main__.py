"""``python -m pyhpc.train``: one training rank, as srun and torchrun start it (see
:func:`pyhpc.train.loop.main`)."""
import sys

from pyhpc.train.loop import main

sys.exit(main())
