"""The import direction is a contract: preprocess -> core <- loaders, and only the umbrella `dctdata.api`
and the CLI join them. Checked on the source, function-level imports included, so a lazy import
cannot hide an upward edge or a cycle."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"dctdata": "dctdata", "preprocess": "dctdata.preprocess", "loaders": "dctdata.loaders"}
# Not core: they may join the rooms (the package facade and the umbrella API, the CLI, and what only
# the CLI runs). The facade `dctdata` joins them only through its lazy `_LAZY` table (module
# `__getattr__`: `dctdata.make_loader` imports dctdata.loaders.distributed on first use), which
# `test_lazy_names_point_where_the_rules_allow` checks; those edges are left out of the graph below,
# since they run on attribute access, never while a module is being imported.
JOINERS = (
    "dctdata",
    "dctdata.api",
    "dctdata.cli",
    "dctdata.__main__",
    "dctdata.commands",
    "dctdata.demo",
)
UPPER = (
    "dctdata.preprocess",
    "dctdata.loaders",
    "dctdata.cli",
    "dctdata.commands",
    "dctdata.demo",
    "dctdata.api",
)


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "dctdata" and parts and parts[0] in ("preprocess", "loaders"):
                continue
            out[name] = path
    return out


@functools.cache
def parsed(path: pathlib.Path, text: str) -> ast.Module:
    """The syntax tree of a source text, parsed once for the module's tests (parsing every module again in
    each test was most of their time)."""
    return ast.parse(text, str(path))


def imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every dctdata module `path` imports, anywhere in the file (module level or inside functions)."""
    tree = parsed(path, path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def extensions() -> set[str]:
    """C extension modules (built from `<name>.c` beside the Python sources): leaves of the graph."""
    out = set()
    for folder, package in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.c"):
            out.add(".".join([package, *path.relative_to(ROOT / folder).with_suffix("").parts]))
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | extensions()
    return {name: imports(name, path, known) for name, path in mods.items()}


def is_core(name: str) -> bool:
    return name.startswith("dctdata") and not name.startswith((*UPPER, "dctdata.datasets")) and name not in JOINERS


def test_the_graph_sees_function_level_imports():
    g = graph()
    assert "dctdata.preprocess.pack" in g["dctdata.api"]  # imported inside pack()
    assert "dctdata.loaders.options" in g["dctdata.api"]  # imported inside open_dataset()
    assert len(g) > 50


def test_core_never_imports_upward():
    upward = {
        (a, b)
        for a, deps in graph().items()
        if is_core(a)
        for b in deps
        if b.startswith(UPPER) or b.startswith("dctdata.datasets")
    }
    assert not upward, f"core modules reaching up: {sorted(upward)}"


def test_preprocess_and_loaders_never_import_each_other():
    g = graph()
    bad = {
        (a, b)
        for a, deps in g.items()
        for b in deps
        if (a.startswith("dctdata.preprocess") and b.startswith("dctdata.loaders"))
        or (a.startswith("dctdata.loaders") and b.startswith("dctdata.preprocess"))
    }
    assert not bad, sorted(bad)


def test_no_cycles():
    g = graph()
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_product_never_imports_the_benchmarks_or_tests():
    """benchmarks/ and tests/ are outside the wheel: a product module importing them breaks the installed package."""
    bad = set()
    for name, path in modules().items():
        for node in ast.walk(parsed(path, path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            bad.update((name, t) for t in targets if t.split(".")[0] in ("benchmarks", "tests", "examples"))
    assert not bad, sorted(bad)


def benchmark_uses(source: str, filename: str = "<test>") -> list[str]:
    """What in a test module's source reaches into benchmarks/: imports of `benchmarks` (statements and
    importlib.import_module), and paths to a file there (`... / "benchmarks"`, "benchmarks/x.py")."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "benchmarks"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "benchmarks":
            found.append(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module",
            "join",
        ):
            found += [f"line {node.lineno}: {a.value!r}" for a in node.args if _names_benchmarks(a)]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _names_benchmarks(node.right):
            found.append(f"line {node.lineno}: / {node.right.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"(?:\S*/)?benchmarks/\S+\.py", node.value):
                found.append(f"line {node.lineno}: {node.value!r}")
    return found


def _names_benchmarks(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(".")[0] == "benchmarks"


def test_the_tests_never_import_the_benchmarks():
    """tests/ checks the product and owns the helpers the benchmarks share (shipped_images, sci_fields, loopback,
    pack_checks): a benchmark may change or go without breaking a test. The benchmarks' own tests live in
    benchmarks/tests/."""
    bad = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        uses = benchmark_uses(path.read_text(), str(path))
        if uses:
            bad[str(path.relative_to(ROOT))] = uses
    assert not bad, bad


@pytest.mark.parametrize(
    "source, found",
    [
        ("import benchmarks.rd\n", ["benchmarks.rd"]),
        ("def f():\n    from benchmarks.images import x\n", ["benchmarks.images"]),
        ("import importlib\nimportlib.import_module('benchmarks.gpu')\n", ["line 2: 'benchmarks.gpu'"]),
        ("p = ROOT / 'benchmarks' / 'gpu.py'\n", ["line 1: / 'benchmarks'"]),
        ("p = os.path.join(d, '..', 'benchmarks', 'gpu.py')\n", ["line 1: 'benchmarks'"]),
        ("run(['python', 'benchmarks/gpu_layer.py'])\n", ["line 1: 'benchmarks/gpu_layer.py'"]),
        ("from sci_fields import micrographs\ndoc = 'see docs/benchmarks/index.md'\n", []),
    ],
)
def test_the_benchmark_finder(source, found):
    assert benchmark_uses(source) == found


def lazy_table(path: pathlib.Path) -> dict[str, str]:
    """The `_LAZY = {name: module}` literal of a package facade."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_LAZY"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path}: no _LAZY table")


def test_lazy_names_point_where_the_rules_allow():
    known = set(modules())
    facade = lazy_table(ROOT / "dctdata" / "__init__.py")
    assert "dctdata" in JOINERS and set(facade.values()) <= known
    assert "dctdata.loaders.distributed" in facade.values()  # the join is there, and allowed
    loaders = lazy_table(ROOT / "loaders" / "__init__.py")
    assert set(loaders.values()) <= known
    outside = {m for m in loaders.values() if not m.startswith("dctdata.loaders.")}
    assert not outside, f"dctdata.loaders' lazy names must stay in loaders: {sorted(outside)}"


def test_version_module_has_no_imports():
    tree = ast.parse((ROOT / "dctdata" / "_version.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


@pytest.mark.parametrize(
    "source, bad",
    [
        ("def f():\n    from dctdata.loaders import zarr_dataset\n", "dctdata.loaders.zarr_dataset"),
        ("import dctdata.preprocess.pack as p\n", "dctdata.preprocess.pack"),
    ],
)
def test_the_checker_catches_a_lazy_upward_import(tmp_path, source, bad):
    path = tmp_path / "x.py"
    path.write_text(source)
    known = set(modules())
    found = imports("dctdata.codec.transform", path, known)
    assert bad in found and is_core("dctdata.codec.transform")


# floor -> the core packages and top-level modules on it (a package's subpackages stand with it)
FLOORS = [
    ("ground", ["dctdata._version", "dctdata.errors", "dctdata.parse", "dctdata.kinds", "dctdata.pool"]),
    ("codec", ["dctdata.codec"]),
    ("entropy", ["dctdata.entropy"]),
    ("stages", ["dctdata.stages"]),
    ("decoder", ["dctdata.decoder"]),
    ("encoder and format", ["dctdata.encoder", "dctdata.format"]),
    ("application", ["dctdata.settings", "dctdata.report", "dctdata.verify"]),
]
TOP_LEVEL_LIMIT = 12


def floor_of(module: str) -> int | None:
    for i, (_, members) in enumerate(FLOORS):
        if any(module == m or module.startswith(m + ".") for m in members):
            return i
    return None


def test_every_core_module_has_a_floor():
    g = graph()
    core = [m for m in g if m.startswith("dctdata.") and not m.startswith(UNFLOORED)]
    lost = sorted(m for m in core if floor_of(m) is None)
    assert not lost, f"core modules on no floor (add them to FLOORS or a layer folder): {lost}"


UNFLOORED = (
    "dctdata.preprocess",
    "dctdata.loaders",
    "dctdata.api",
    "dctdata.cli",
    "dctdata.__main__",
    "dctdata.commands",
    "dctdata.demo",
    "dctdata.datasets",
)


def test_imports_point_to_the_same_floor_or_below():
    up = sorted(
        (a, b)
        for a, deps in graph().items()
        for b in deps
        if floor_of(a) is not None and floor_of(b) is not None and floor_of(b) > floor_of(a)
    )
    assert not up, f"imports reaching a higher floor: {up}"


def test_the_top_level_is_small():
    top = sorted(p.name for p in (ROOT / "dctdata").glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, top


def test_the_layer_folders_exist_as_documented():
    arch = (ROOT / "docs" / "architecture.md").read_text()
    for _, members in FLOORS:
        for m in members:
            path = ROOT / pathlib.Path(*m.split("."))
            assert path.is_dir() or path.with_suffix(".py").is_file(), m
            assert m.split(".", 1)[1] in arch, f"docs/architecture.md does not name {m}"
