"""``tests/fixtures/record.py``, the script that records the captures, as a module the e2e tests import.

It is a standalone script (run as ``python tests/fixtures/record.py``), not in a package, so it is loaded once by
its path and registered in ``sys.modules`` under one name (its dataclasses look their module up there): every
test module gets the same ``SCENARIOS`` and launch helpers the recordings were made with.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

NAME = "fixture_recorder"
PATH = Path(__file__).resolve().parent.parent / "fixtures" / "record.py"


def _load() -> ModuleType:
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, PATH)
    assert spec is not None and spec.loader is not None, PATH
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module


record = _load()
