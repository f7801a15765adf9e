"""pyhpc: a GPU research cluster in a box (deploy, submit, measure)."""
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``pyhpc.submit(fn, nodes=2, ...)`` without importing submitit at ``import pyhpc``."""
    if name == "submit":
        import importlib

        return importlib.import_module("pyhpc.submit")
    raise AttributeError(f"module 'pyhpc' has no attribute {name!r}")
