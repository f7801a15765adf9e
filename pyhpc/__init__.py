"""pyhpc: a GPU research cluster in a box (deploy, submit, measure)."""
__version__ = "0.1.0"
