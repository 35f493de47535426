"""One page for the environment variables (docs/environment.md) and one table of the read options
(docs/api/pack.md): every `DCTDATA_*` variable the code reads is on the page and every variable on the
page is read somewhere; the other pages that name one link to it; the read options' table lists exactly
the fields of `ReadOptions`."""

from __future__ import annotations

import pathlib
import re

from dctdata.loaders.options import READ_OPTIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "environment.md"
PRODUCT = ("dctdata", "loaders", "preprocess")  # the installed package's sources (loaders/ and preprocess/ map in)
NAME_RE = re.compile(r"\bDCTDATA_[A-Z0-9_]+\b")
# a read: os.environ.get("X"), os.getenv("X"), os.environ["X"] (a test's monkeypatch.setenv is no read)
READ_RE = re.compile(
    r"""(?:environ\.get|getenv|environ\.setdefault)\(\s*["'](DCTDATA_[A-Z0-9_]+)"""
    r"""|environ\[\s*["'](DCTDATA_[A-Z0-9_]+)"""
)


def read_in(folders: tuple[str, ...]) -> set[str]:
    names = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if path.resolve() == pathlib.Path(__file__).resolve():
                continue
            for m in READ_RE.finditer(path.read_text(encoding="utf-8")):
                names.add(m.group(1) or m.group(2))
    return names


def named_in(folders: tuple[str, ...]) -> set[str]:
    return {m for f in folders for p in (ROOT / f).rglob("*.py") for m in NAME_RE.findall(p.read_text("utf-8"))}


def tabled(text: str) -> set[str]:
    """The variables in the first column of the page's tables."""
    return set(re.findall(r"^\| `(DCTDATA_[A-Z0-9_]+)` \|", text, re.M))


def test_every_variable_the_library_reads_is_on_the_page():
    read = read_in(PRODUCT)
    assert {"DCTDATA_FUSED_KERNEL", "DCTDATA_READ_THREADS"} <= read  # the scan finds reads
    assert read - tabled(PAGE.read_text("utf-8")) == set()


def test_every_variable_named_in_the_code_is_on_the_page():
    assert named_in(PRODUCT) - tabled(PAGE.read_text("utf-8")) == set()


def test_every_variable_on_the_page_is_read_by_the_library_or_its_tests():
    text = PAGE.read_text("utf-8")
    listed = tabled(text)
    assert listed and listed == set(NAME_RE.findall(text))  # every name the page mentions has its row
    assert listed - read_in((*PRODUCT, "tests", "benchmarks")) == set()


def test_pages_that_name_a_variable_link_the_page():
    missing = []
    for page in (ROOT / "docs").rglob("*.md"):
        if page == PAGE or page.name == "changelog.md":  # the changelog records history
            continue
        text = page.read_text("utf-8")
        if NAME_RE.search(text) and "environment.md" not in text:
            missing.append(str(page.relative_to(ROOT)))
    assert missing == []


def test_the_read_options_table_lists_the_fields_of_read_options():
    text = (ROOT / "docs" / "api" / "pack.md").read_text("utf-8")
    section = text.split("## Read options", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert tuple(rows) == READ_OPTIONS
