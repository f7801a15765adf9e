"""``pyhpc bench``: node and interconnect micro-benchmarks, run as one Slurm job."""
