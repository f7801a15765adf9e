"""The reference workload: its settings, the DDP training loop (``python -m pyhpc.train``),
step metrics, start-up marks, sweeps over node counts and batch sizes, and the report."""
