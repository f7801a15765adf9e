"""Load a script of the repository as a module by its path: `hostlab` is also the name of
the hostlab/ directory, and a role's files/ are no package."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from pyhpc import paths


def load(name: str, relative: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, paths.ROOT / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
