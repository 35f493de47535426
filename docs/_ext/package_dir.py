"""Griffe extension for the API pages: load `dctdata.preprocess` and `dctdata.loaders` from their folders.

The wheel maps the repository's `preprocess/` and `loaders/` folders to `dctdata.preprocess` and
`dctdata.loaders` (setuptools `package-dir`, see pyproject.toml). Griffe reads a package statically from
its folder and so finds neither under `dctdata/`; this extension reads pyproject's mapping and attaches
each mapped folder to the `dctdata` package as it is loaded, so mkdocstrings sees the same module paths
a user imports. Griffe has no public call for loading a folder under a given parent, hence
`GriffeLoader._load_module` (the call griffe itself uses for submodules).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import griffe

if sys.version_info >= (3, 11):
    import tomllib
else:  # the dev extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def mapped_packages(root: Path = ROOT) -> dict[str, Path]:
    """`{"dctdata.loaders": <root>/loaders, ...}`: pyproject's package-dir entries that leave `dctdata/`."""
    with open(root / "pyproject.toml", "rb") as fh:
        mapping = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in mapping.items() if "." in name}


class PackageDir(griffe.Extension):
    """Attach each mapped folder under its parent package when that package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for name, folder in mapped_packages().items():
            parent, _, child = name.rpartition(".")
            if parent != pkg.path or child in pkg.members:
                continue
            module = loader._load_module(child, folder / "__init__.py", submodules=True, parent=pkg)
            pkg.set_member(child, module)
