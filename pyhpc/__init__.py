"""pyhpc: a GPU research cluster in a box (deploy, submit, measure).

``import pyhpc`` stays light: the API below is imported on first use (PEP 562), so a
training rank that imports ``pyhpc.train`` pays for neither jinja2 nor YAML, and torch
and submitit are imported only when a job is submitted or run.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyhpc.errors import PyhpcError as PyhpcError
    from pyhpc.slurm.jobspec import JobSpec as JobSpec
    from pyhpc.slurm.submit import ScriptJob as ScriptJob
    from pyhpc.slurm.submit import SubmitError as SubmitError
    from pyhpc.slurm.submit import submit as submit
    from pyhpc.slurm.submit import submit_array as submit_array
    from pyhpc.slurm.submit import submit_script as submit_script
    from pyhpc.slurm.submit import submit_template as submit_template
    from pyhpc.train.sweep import submit_training as submit_training

__version__ = "0.1.0"
#: The public API: name -> the module that defines it.
_API = {**dict.fromkeys(("ScriptJob", "SubmitError", "submit", "submit_array", "submit_script",
                         "submit_template"), "pyhpc.slurm.submit"),
        "PyhpcError": "pyhpc.errors", "JobSpec": "pyhpc.slurm.jobspec",
        "submit_training": "pyhpc.train.sweep"}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name == "meter":  # pyhpc.meter.Meter after a bare ``import pyhpc``
        return importlib.import_module("pyhpc.meter")
    if name not in _API:
        raise AttributeError(f"module 'pyhpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value
