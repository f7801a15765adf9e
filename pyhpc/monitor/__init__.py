"""Seeing every job and every node: Prometheus exporters for Slurm (one per cluster) and
for the jobs on each compute host, and per-job summaries (``pyhpc jobstats``)."""
