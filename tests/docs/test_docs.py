"""The README stays a front page and every relative link in README.md and docs/ resolves.

`mkdocs build --strict` (CI, after the tests) checks the site's own pages, anchors and API references; the
README is not part of the site, so its links are checked here, and the docs' file links too, so a moved
page fails the fast test run and not only the docs build.
"""

from __future__ import annotations

import os
import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 200
# The README's two set-up commands, exactly as .ci/run runs them.
SETUP_COMMANDS = ("pip install -e . && dctdata demo", 'pip install -e ".[dev]" && pytest -n auto')

FENCE_RE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN_RE = re.compile(r"`[^`\n]*`")
INLINE_LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF_RE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
EXTERNAL_RE = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def link_targets(markdown: str) -> list[str]:
    """Targets of the Markdown links and images in `markdown`, outside code blocks and code spans."""
    text = CODE_SPAN_RE.sub("", FENCE_RE.sub("", markdown))
    return INLINE_LINK_RE.findall(text) + REFERENCE_DEF_RE.findall(text)


def broken_links(page: pathlib.Path) -> list[str]:
    """The relative links of `page` whose file does not exist (anchors are mkdocs --strict's job)."""
    broken = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if EXTERNAL_RE.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = (ROOT / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
        if not resolved.exists():
            broken.append(target)
    return broken


def doc_pages() -> list[pathlib.Path]:
    return sorted(DOCS.rglob("*.md"))


def test_readme_is_at_most_200_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference material to docs/"


def test_readme_keeps_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    for command in SETUP_COMMANDS:
        assert command in text, f"README.md lacks the set-up command {command!r}"


def test_ci_runs_the_readmes_commands():
    """.ci/run runs what the README's two commands run (after their install step), each as a line of its own."""
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in SETUP_COMMANDS:
        run = command.split(" && ", 1)[1]
        assert run in lines, f".ci/run lacks the README's command {run!r}"


def python_blocks(markdown: str) -> list[str]:
    """The bodies of the ```python fenced blocks of `markdown`, in order."""
    return re.findall(r"^```python\n(.*?)^```", markdown, re.M | re.S)


def test_the_readme_quick_start_runs_as_written(tmp_path, capsys, monkeypatch):
    """The quick start is the README's one Python block: it packs, loads and trains here, on the CPU."""
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) == 1, f"README.md should hold one Python block (the quick start), has {len(blocks)}"
    script = tmp_path / "quick_start.py"
    script.write_text(blocks[0], encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(os.environ, "CUDA_VISIBLE_DEVICES", "")  # as on a CPU-only machine
    namespace = runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert re.search(r"^0\.\d{3} of float32, PSNR min (\d+\.\d) dB$", out, re.M), out
    assert float(re.search(r"PSNR min (\d+\.\d)", out).group(1)) >= 39.0  # the per-sample floor: target - 0.4 dB
    assert (tmp_path / "train.dct" / "manifest.json").is_file()
    assert namespace["images"].shape == (32, 1, 64, 64) and namespace["loss"].isfinite()


def test_every_relative_link_in_the_readme_resolves():
    targets = link_targets(README.read_text(encoding="utf-8"))
    assert any(t.startswith("docs/") for t in targets), "README.md links to no docs page"
    assert broken_links(README) == []


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_relative_link_in_the_docs_resolves(page):
    assert broken_links(page) == []


def test_the_docs_have_the_pages_the_readme_promises():
    names = {str(p.relative_to(DOCS)) for p in doc_pages()}
    expected = {"index.md", "quickstart.md", "format.md", "changelog.md", "benchmarks/index.md", "api/index.md"}
    assert expected <= names, f"docs/ lacks {sorted(expected - names)}"


def test_a_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# there\n")
    page.write_text(
        "[ok](there.md) [ok too](there.md#part) [gone](missing.md#x) ![img](gone.png) [web](https://example.org)\n"
        "`[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n[ref]: also-missing.md\n"
    )
    assert broken_links(page) == ["missing.md#x", "gone.png", "also-missing.md"]


def test_link_targets_skip_code():
    assert link_targets("`[a](b.md)`\n\n```python\nx = [a](c.md)\n```\n[d](e.md)") == ["e.md"]


def test_cli_page_lists_every_flag_of_every_command():
    """docs/cli.md names every long flag each subcommand's --help lists (the parser itself is read, so a new
    flag without a line on the page fails here); a `--x`/`--no-x` pair may be written `--[no-]x`."""
    import argparse

    from dctdata.cli import build_parser

    page = (DOCS / "cli.md").read_text(encoding="utf-8")

    def on_page(flag: str) -> bool:
        pair = "--[no-]" + flag.removeprefix("--no-").removeprefix("--")
        return bool(re.search(re.escape(flag) + r"(?![A-Za-z0-9-])", page)) or pair in page

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = {}
    for name, p in {"dctdata": parser, **commands}.items():
        flags = [o for a in p._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
        missing[name] = [o for o in flags if not on_page(o)]
    assert len(commands) >= 6 and "--target-psnr" in page  # the parser and the page were read
    assert not {k: v for k, v in missing.items() if v}, f"flags missing from docs/cli.md: {missing}"


def test_no_page_calls_a_shipped_feature_planned():
    """Volumes (`--dims 3`) and pointwise bounds (`--max-error`) ship: the index and the calibration guide said
    both were "planned". A sentence naming either with "planned" fails here."""
    shipped = re.compile(r"(volume|pointwise bound|--max-error|--max-rel-error|--dims 3)[^.]*\bplanned\b", re.I)
    stale = {}
    for page in doc_pages():
        if page.name == "changelog.md":  # history, written as it was
            continue
        text = page.read_text(encoding="utf-8").replace("\n", " ")
        hits = [m.group(0) for m in shipped.finditer(text)]
        if hits:
            stale[str(page.relative_to(DOCS))] = hits
    assert not stale, stale
