"""The explicit package list must name every package folder, or the wheel silently misses it."""

import importlib
import pathlib
import subprocess
import sys

import pytest

try:  # Python 3.11+; the dev extra installs tomli on 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAPPING = {"dctdata": "dctdata", "preprocess": "dctdata.preprocess", "loaders": "dctdata.loaders"}


def package_folders():
    found = set()
    for folder, name in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    return found


def test_every_package_folder_is_in_the_explicit_list():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    missing = package_folders() - listed
    assert not missing, f"add to [tool.setuptools] packages: {sorted(missing)}"
    assert config["tool"]["setuptools"]["package-dir"] == {v: k for k, v in MAPPING.items()}


@pytest.mark.parametrize("name", sorted(package_folders()))
def test_every_package_imports_under_the_dctdata_namespace(name):
    module = importlib.import_module(name)
    assert module.__name__ == name


def test_no_tests_init_shadowing_the_installed_package():
    assert not (ROOT / "tests" / "__init__.py").exists()


def test_python_dash_m_dctdata_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "dctdata", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("dctdata ")
