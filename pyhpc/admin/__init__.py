"""Running a deployed cluster: its health (``pyhpc doctor`` and the GPU acceptance), the
user directory and workshops."""
