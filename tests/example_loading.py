"""Loading a script of examples/ as a module, for the tests that run them on tiny settings."""

import importlib.util
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name, monkeypatch):
    """examples/<name>.py as a module: examples/ on sys.path (scripts import _common / _unet), and the
    module in sys.modules while it loads (dataclasses look their module up then)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
