"""The API reference is complete: every public function and class documents each parameter.

mkdocstrings renders Google-style `Args:`/`Returns:` sections as the API pages' parameter tables, so a
parameter missing from `Args:` is a parameter missing from the site. Classes document their `__init__`'s
parameters in the class docstring (the pages render the class, not `__init__`).
"""

from __future__ import annotations

import inspect
import re

import pytest

import dctdata

SECTION_RE = re.compile(r"^(\w[\w ]*):\s*$")
ENTRY_RE = re.compile(r"^(\*{0,2}\w+)(?:\s*\([^)]*\))?:(?:\s|$)")


def public_callables() -> list[str]:
    """The names of `dctdata.__all__` that are functions or classes, errors excepted (they take a message)."""
    names = []
    for name in dctdata.__all__:
        value = getattr(dctdata, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            continue
        if inspect.isfunction(value) or inspect.isclass(value):
            names.append(name)
    return names


def section(doc: str, title: str) -> list[str] | None:
    """The entry names of a Google-style section of `doc` (None when it has no such section)."""
    lines = inspect.cleandoc(doc).splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == f"{title}:" and not line.startswith(" ")]
    if not starts:
        return None
    entries, indent = [], None
    for line in lines[starts[0] + 1 :]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if width == 0:  # the next section or prose
            break
        if indent is None:
            indent = width
        if width == indent and (m := ENTRY_RE.match(line.strip())):
            entries.append(m.group(1))
    return entries


def parameters(obj: object) -> list[str]:
    """The parameters a caller passes: `__init__`'s for a class, without self; *args/**kwargs with stars."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    names = []
    for p in inspect.signature(target).parameters.values():
        if p.name == "self":
            continue
        stars = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(stars + p.name)
    return names


def reference_problems(obj: object) -> list[str]:
    """What the reference of `obj` lacks: undocumented parameters, a missing Returns section."""
    doc = inspect.getdoc(obj) or ""
    documented = section(doc, "Args") or []
    problems = [f"Args: no entry for {name}" for name in parameters(obj) if name not in documented]
    if inspect.isfunction(obj):
        returns = inspect.signature(obj).return_annotation
        if returns not in (None, "None") and section(doc, "Returns") is None:
            problems.append("no Returns: section")
    return problems


def test_the_public_api_has_names_to_check():
    names = public_callables()
    assert {"pack", "open_dataset", "Writer", "PackSettings", "CodecSpec", "Decompress"} <= set(names)
    assert "DctDataError" not in names


@pytest.mark.parametrize("name", public_callables())
def test_every_parameter_is_documented(name):
    assert reference_problems(getattr(dctdata, name)) == []


def test_open_dataset_documents_every_keyword_of_both_dataset_classes():
    from dctdata.loaders.wds_dataset import DCTWebDataset
    from dctdata.loaders.zarr_dataset import DCTZarrDataset

    doc = inspect.getdoc(dctdata.open_dataset)
    documented = set(section(doc, "Keyword Args"))  # griffe checks Args against the signature: **kwargs' are here
    taken = (set(parameters(DCTZarrDataset)) | set(parameters(DCTWebDataset)) | {"sha256"}) - {"path_or_url"}
    assert taken - documented == set()


def test_a_missing_parameter_or_returns_is_caught():
    def documented(a: int, b: int = 0, **extra: int) -> int:
        """Why it exists.

        Args:
            a: The first.
            b (int): The second, whose entry runs on
                a continuation line.
            **extra: The rest.

        Returns:
            Their sum.
        """
        return a + b

    def incomplete(a: int, b: int = 0, **extra: int) -> int:
        """Why it exists.

        Args:
            a: The first; `b: mentioned` in prose is no entry.
                b: nor is an entry at a deeper indent.
        """
        return a + b

    assert reference_problems(documented) == []
    assert reference_problems(incomplete) == [
        "Args: no entry for b",
        "Args: no entry for **extra",
        "no Returns: section",
    ]


def entry_texts(doc: str, title: str = "Args") -> dict[str, str]:
    """Each entry of a section with its text, continuation lines joined."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index(f"{title}:")
    out, name, indent = {}, None, None
    for line in lines[start + 1 :]:
        if not line.strip() or not line.startswith(" "):
            break
        width = len(line) - len(line.lstrip())
        indent = width if indent is None else indent
        m = ENTRY_RE.match(line.strip()) if width == indent else None
        if m:
            name = m.group(1)
            out[name] = line.strip()[m.end() :].strip()
        elif name is not None:
            out[name] += " " + line.strip()
    return out


@pytest.mark.parametrize("name", ["PackSettings", "pack", "Writer"])
def test_setting_entries_say_what_the_setting_declares(name):
    """A setting is declared once (its field's help is the CLI's --help): the reference's entries for it in
    `PackSettings`, `pack` and `Writer` say the same, so the pages cannot drift from `--help`."""
    import dataclasses

    from dctdata.settings import PackSettings

    helps = {f.name: f.metadata["help"].replace("%%", "%") for f in dataclasses.fields(PackSettings)}
    texts = entry_texts(getattr(dctdata, name).__doc__)
    shared = sorted(set(texts) & set(helps))
    assert len(shared) >= 20, shared  # the settings are documented here at all
    differ = {k: (texts[k], helps[k]) for k in shared if texts[k].rstrip(".") != helps[k].strip().rstrip(".")}
    assert not differ, f"{name}: Args entries that differ from the setting's help: {differ}"
