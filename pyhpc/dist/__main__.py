"""``python -m pyhpc.dist SCRIPT|-m MODULE [ARGS]``: the job templates' launcher (see
:func:`pyhpc.dist.main`)."""
import sys

from pyhpc.dist import main

main(sys.argv[1:])
