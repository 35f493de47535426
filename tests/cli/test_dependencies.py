"""The declared dependencies match what the product imports: every third-party module a product module
imports (at module level or inside a function) comes from a distribution pyproject.toml declares, in
`dependencies` when the import is unguarded, or in the extra that the import's guard names
(`except ImportError: raise DctDataError("... pip install 'dctdata[EXTRA]' ...")`)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import pathlib
import re
import sys

import pytest
from packaging.requirements import Requirement

try:  # Python 3.11+; the dev extra installs tomli on 3.10
    import tomllib
except ModuleNotFoundError:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("dctdata", "preprocess", "loaders")  # the folders the wheel installs
EXTRA_RE = re.compile(r"dctdata\[([a-z0-9_-]+)\]")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {normalize(Requirement(r).name) for r in project["dependencies"]}
    extras = {k: {normalize(Requirement(r).name) for r in v} for k, v in project["optional-dependencies"].items()}
    return deps, extras


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(k, "id", None) in ("ImportError", "ModuleNotFoundError") for k in kinds)


def _guard_extras(tree: ast.AST, node: ast.stmt) -> set[str] | None:
    """The extras named by the ImportError handlers of the try blocks around `node` (None: unguarded)."""
    for parent in ast.walk(tree):
        if isinstance(parent, ast.Try) and any(node is n for stmt in parent.body for n in ast.walk(stmt)):
            handlers = [h for h in parent.handlers if _catches_import_error(h)]
            if handlers:
                texts = [c.value for h in handlers for c in ast.walk(h) if isinstance(c, ast.Constant)]
                return {m for t in texts if isinstance(t, str) for m in EXTRA_RE.findall(t)}
    return None


@functools.cache
def third_party_imports() -> dict[str, dict[str, set[str] | None]]:
    """top-level module -> {"path:line": extras named by its guard, or None when unguarded}. A module that
    guards an import guards every import of that name in the module (its functions run after the check).
    Walked once for the module's tests (callers only read it): the walk was most of their time."""
    out: dict[str, dict[str, set[str] | None]] = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            seen: dict[str, list[tuple[str, set[str] | None]]] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in ("dctdata", "__future__"):
                        continue
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    seen.setdefault(top, []).append((where, _guard_extras(tree, node)))
            for top, uses in seen.items():
                guards = [g for _, g in uses if g is not None]
                extras = set().union(*guards) if guards else None
                out.setdefault(top, {}).update({where: extras for where, _ in uses})
    return out


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distribution(module: str) -> str:
    found = _distributions().get(module)
    return normalize(found[0] if found else module)


def test_the_walk_sees_lazy_imports_and_guards():
    imports = third_party_imports()
    assert any(w.startswith("dctdata/format/zarr/shards.py") for w in imports["google_crc32c"])  # module level
    assert imports["aiohttp"] and all(v is None for v in imports["aiohttp"].values())  # in a function, unguarded
    assert all(v == {"xarray"} for v in imports["xarray"].values())  # the guard's message names the extra
    assert all(v == {"dask"} for v in imports["dask"].values())  # guarded in require_dask, used after it


def test_every_import_is_declared():
    deps, extras = declared()
    problems = []
    for module, uses in sorted(third_party_imports().items()):
        dist = distribution(module)
        for where, guard in uses.items():
            if guard is None and dist not in deps:
                problems.append(f"{where}: {module} ({dist}) is imported unguarded but not in dependencies")
            elif guard is not None and dist not in deps:
                if not guard:
                    problems.append(f"{where}: {module}'s ImportError guard names no extra (pip install 'dctdata[X]')")
                elif not any(dist in extras.get(e, ()) for e in guard):
                    problems.append(f"{where}: {module} ({dist}) is not in the extra its guard names: {sorted(guard)}")
    assert not problems, "\n".join(problems)


def test_every_dependency_is_imported():
    """A runtime dependency the product never imports is an install every user pays for: tests, benchmarks and
    examples take theirs from the dev and bench extras."""
    deps, _ = declared()
    imported = {distribution(m) for m in third_party_imports()}
    assert not deps - imported, f"declared but never imported by {PRODUCT}: {sorted(deps - imported)}"


@pytest.mark.parametrize(
    "source, extras",
    [
        ("import h5py\n", None),
        ("def f():\n    import dask\n", None),
        (
            "def f():\n    try:\n        import xarray\n    except ImportError as e:\n"
            "        raise ValueError(f\"pip install 'dctdata[xarray]'. Got {e}\")\n",
            {"xarray"},
        ),
        ("try:\n    import zfpy\nexcept ModuleNotFoundError:\n    zfpy = None\n", set()),
    ],
)
def test_the_guard_reader(source, extras):
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Import))
    assert _guard_extras(tree, node) == extras
