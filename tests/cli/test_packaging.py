"""The explicit package list must name every package folder, or the wheel silently misses it."""

import importlib
import os
import pathlib
import subprocess
import sys
import warnings

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


def _build_py():
    """setuptools' build_py command (what `pip wheel` runs) configured from pyproject.toml."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    cwd = os.getcwd()
    os.chdir(ROOT)  # the configuration's paths are relative to the project
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ext-modules in pyproject.toml is "experimental"
            dist = Distribution({"script_name": "setup.py"})
            apply_configuration(dist, "pyproject.toml")
            build_py = dist.get_command_obj("build_py")
            build_py.ensure_finalized()
            build_py.data_files  # noqa: B018 - computed on first access, from the project folder
    finally:
        os.chdir(cwd)
    return build_py


def wheel_modules() -> dict[str, pathlib.Path]:
    """module name -> source file of every Python module the wheel holds, as build_py finds them."""
    cwd = os.getcwd()
    build_py = _build_py()
    os.chdir(ROOT)
    try:
        found = build_py.find_all_modules()
    finally:
        os.chdir(cwd)
    return {f"{package}.{module}".removesuffix(".__init__"): ROOT / path for package, module, path in found}


def test_the_wheel_holds_no_c_source():
    """The extensions' C sources go to the sdist, not the wheel: include-package-data is off (it would copy every
    sdist file inside a package), and the only data files are py.typed, the type stubs of the C extensions
    (a typed package's checkers read them) and the GPU entropy decoder's kernel source, which
    entropy/device.py compiles at run time with NVRTC. .ci/run checks the built wheel too."""
    build_py = _build_py()
    assert build_py.distribution.include_package_data is False
    data = sorted(
        f"{package.replace('.', '/')}/{name}" for package, _, _, names in build_py.data_files for name in names
    )
    stubs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "dctdata").rglob("*.pyi"))
    assert stubs and all((ROOT / s).with_suffix(".c").exists() for s in stubs)  # a stub for a C extension
    assert data == sorted(["dctdata/entropy/ctxrans_lanes.h", "dctdata/py.typed", *stubs])


def test_the_wheel_holds_the_product_and_no_benchmark():
    modules = wheel_modules()
    # every product module, from the three mapped folders
    for folder, package in MAPPING.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join([package, *parts]).removesuffix(".__init__")
            assert name in modules, f"the wheel lacks {name}"
    assert {"dctdata.demo.pipeline", "dctdata.datasets.em", "dctdata.commands.pack"} <= set(modules)
    # nothing from the benchmarks, the tests or the examples
    outside = sorted(n for n, path in modules.items() if path.parts[len(ROOT.parts)] not in MAPPING)
    assert not outside, outside
    moved = {"dctdata.bench", "dctdata.commands.bench", "dctdata.datasets.images", "dctdata.datasets.fields"}
    benches = sorted(n for n in modules if n in moved or n.startswith("dctdata.bench."))
    assert not benches, benches
    assert not (ROOT / "dctdata" / "bench").exists()


@pytest.mark.parametrize("name", sorted(package_folders()))
def test_every_package_imports_under_the_dctdata_namespace(name):
    module = importlib.import_module(name)
    assert module.__name__ == name


def test_no_tests_init_shadowing_the_installed_package():
    assert not (ROOT / "tests" / "__init__.py").exists()


def test_python_dash_m_dctdata_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "dctdata", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("dctdata ")
