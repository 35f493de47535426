"""The flat public API: every name of `dctdata` and of `dctdata.loaders` is its defining module's object,
imported on first use, so `import dctdata` (and `import dctdata.loaders`) stays light."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import dctdata
import dctdata.loaders

QUICK_START = ["pack", "Writer", "open_dataset", "make_loader", "set_epoch", "DevicePrefetcher", "Decompress",
               "CodecSpec", "balance_threads", "PackSettings", "compress", "decompress"]  # fmt: skip
HEAVY = (
    "torch",
    "numpy",
    "zarr",
    "webdataset",
    "h5py",
    "numcodecs",
    "fsspec",
    "dctdata.loaders.",
    "dctdata.preprocess",
)


@pytest.mark.parametrize("package", [dctdata, dctdata.loaders], ids=lambda p: p.__name__)
def test_every_public_name_is_its_modules_object(package):
    for name in package.__all__:
        value = getattr(package, name)
        home = package._LAZY.get(name)
        if home is not None:
            assert getattr(importlib.import_module(home), name) is value, name
        assert name in dir(package)
    assert set(package._LAZY) <= set(package.__all__)


def test_the_quick_start_names_come_from_dctdata():
    assert set(QUICK_START) <= set(dctdata.__all__)
    from dctdata import DevicePrefetcher, balance_threads, make_loader, set_epoch
    from dctdata.loaders.device import DevicePrefetcher as D
    from dctdata.loaders.distributed import make_loader as m
    from dctdata.loaders.distributed import set_epoch as s
    from dctdata.loaders.threads import balance_threads as b

    assert (DevicePrefetcher, make_loader, set_epoch, balance_threads) == (D, m, s, b)


@pytest.mark.parametrize("package", [dctdata, dctdata.loaders], ids=lambda p: p.__name__)
def test_an_unknown_name_is_an_attribute_error(package):
    with pytest.raises(AttributeError, match=rf"module '{package.__name__}' has no attribute 'frobnicate'"):
        package.frobnicate  # noqa: B018


@pytest.mark.parametrize("statement", ["import dctdata", "import dctdata.loaders", "import dctdata.cli"])
def test_importing_the_package_imports_nothing_heavy(statement):
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in loaded if m.startswith(HEAVY) or m == "dctdata.api"]
    assert not heavy, f"{statement} imports {heavy}"


@pytest.fixture(scope="module")
def fresh_imports() -> list[str]:
    """One new interpreter (starting it and importing torch, through the encoder, is most of these tests'
    time) that imports the module dctdata.encoder.quantize before the package's facade, then touches the lazy
    name `balance_threads`. Its output: whether `dctdata.quantize` is the function, the modules loaded before
    the lazy name, a separator line, the modules loaded after it."""
    code = (
        "import sys; import dctdata.encoder.quantize; import dctdata; "
        "print(dctdata.quantize is sys.modules['dctdata.encoder.quantize'].quantize); "
        "print('\\n'.join(sorted(sys.modules))); print('--'); dctdata.balance_threads; "
        "print('\\n'.join(sorted(sys.modules)))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_a_lazy_name_imports_only_its_side(fresh_imports):
    cut = fresh_imports.index("--")
    before, loaded = fresh_imports[1:cut], fresh_imports[cut + 1 :]
    assert "dctdata.loaders.threads" not in before and "dctdata.loaders.threads" in loaded
    assert not [m for m in loaded if m.startswith(("dctdata.preprocess", "webdataset", "zarr", "h5py"))]


def test_a_function_named_like_its_module_stays_the_function(fresh_imports):
    """Importing the module dctdata.quantize sets the package's attribute `quantize`; the facade keeps the
    function there (the module stays in sys.modules for `from dctdata.encoder.quantize import ...`)."""
    assert fresh_imports[0] == "True"


@pytest.mark.parametrize("old", ["wire", "quantize", "transform", "nvcomp_zstd", "layer", "calibrate"])
def test_a_moved_modules_old_path_imports_the_same_module_with_a_warning(old):
    """Issue 48 moved the flat core modules into floors; code importing the old path keeps working."""
    import importlib
    import sys

    floor = dctdata._MOVED[old]
    new = importlib.import_module(f"dctdata.{floor}.{old}")
    sys.modules.pop(f"dctdata.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"dctdata\.{old} moved to dctdata\.{floor}\.{old}"):
        module = importlib.import_module(f"dctdata.{old}")
    assert module is new
    assert callable(dctdata.quantize) and dctdata.quantize.__module__ == "dctdata.encoder.quantize"


def test_every_moved_module_is_where_the_table_says():
    import importlib

    for old, floor in dctdata._MOVED.items():
        assert importlib.util.find_spec(f"dctdata.{floor}.{old}") is not None, old
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dctdata.no_such_module")
