"""Import an authors' file over stand-in modules, restoring `sys.modules` afterwards.

The authors' selection code sits in files that import their training stack (torch,
torchvision, their data loaders, a solver) at the top, though the selection never calls it.
The drivers import such a file with empty stand-ins in those modules' places, for the import
only, so the rest of the process (fedsel, NumPy, the real packages where installed) sees
`sys.modules` as it was.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def import_over(module_name: str, path: Path, stand_ins: dict[str, types.ModuleType]):
    """The module at `path`, imported as `module_name` with `stand_ins` (name -> module) in
    `sys.modules` while it runs; whatever those names held before is put back after."""
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module
