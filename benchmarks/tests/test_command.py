"""`python -m benchmarks`: one command lists and runs every benchmark; the tables' tables, their help
and their one-line errors."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import SCRIPTS, main
from dctdata.decoder import fused

ROOT = Path(__file__).resolve().parents[2]
TABLES = ["codec", "rd", "loader", "stream", "gpu"]


def test_codec_bench_reports_ratios_against_copy_in_and_out_of_cache_and_paper(capsys):
    args = [
        "codec",
        "--sizes",
        "64",
        "--paper-sizes",
        "64",
        "--cf",
        "2",
        "8",
        "--repeat",
        "1",
        "--threads",
        "1",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 | 64²")]
    assert len(rows) == 2 and "x copy (in cache)" in out and "x copy (out of cache)" in out and "out=)" in out
    head = next(line for line in out.splitlines() if line.startswith("| threads |"))
    assert head.count("|") == rows[0].count("|") and head.rstrip().endswith("| kernel |")  # a well-formed table
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[4]) > 0 and cells[6].endswith("x") and cells[9].endswith("x") and cells[10].endswith("x")
        assert cells[12].endswith("x")
        assert cells[7] == "4096 (67 MB)"  # at least 64 MiB of float32 output per call
        vector = fused.available() and fused.vector_isa() != "portable"
        assert cells[13] == (f"fused ({fused.vector_isa()})" if vector else "torch")


def test_library_errors_become_one_line_without_traceback(capsys):
    assert main(["codec", "--sizes", "64", "--paper-sizes", "64", "--cf", "9", "--repeat", "1"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"python -m benchmarks codec: error: cf: expected an int in 1\.\.8\. Got 9\n", err)


@pytest.mark.parametrize("kind", ["codec", "rd", "loader", "stream", "gpu"])
def test_table_help_has_a_description_and_every_default(kind, capsys):
    with pytest.raises(SystemExit) as exc:
        main([kind, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith(f"usage: python -m benchmarks {kind}") and len(description.split()) >= 5
    blocks = re.split(r"\n(?=  --)", out.split("options:", 1)[1])[1:]  # one per option, help lines included
    assert len(blocks) >= 4
    for block in blocks:
        assert "(default:" in block, f"{block.split()[0]} shows no default"


def test_help_lists_every_table_and_script(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    listed = re.findall(r"^    (\S+)", capsys.readouterr().out, re.M)
    assert listed == [*TABLES, *SCRIPTS]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_runs_under_its_name(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m benchmarks {name} ")


def test_unknown_name_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


@pytest.mark.slow
def test_python_dash_m_benchmarks_from_the_repository_root():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "codec", "--cf", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "python -m benchmarks codec: error: cf: expected an int in 1..8. Got 0\n"


def test_device_decode_rows_on_the_cpu(capsys, tmp_path):
    from benchmarks import device_decode

    argv = ["--samples", "8", "--size", "32", "--workers", "0", "--epochs", "1", "--json", str(tmp_path / "d.json")]
    rows = device_decode.main(argv)
    assert [(r["storage"], r["stage"]) for r in rows] == [
        (s, g) for s in ("zarr", "webdataset") for g in ("default", "zstd")
    ]
    for r in rows:
        assert r["samples_per_s_cpu"] > 0 and r["samples_per_s_device"] > 0 and r["stored_per_sample"] > 0
        assert r["crossed_per_sample_device"] < r["crossed_per_sample_cpu"]  # stored bytes, not coefficients
    assert capsys.readouterr().out.count("samples/s cpu") == 4 and (tmp_path / "d.json").exists()


def test_every_benchmark_has_a_row_in_the_readme():
    """benchmarks/README.md lists every name `python -m benchmarks` runs (its "Adding one" asks for a row)."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, re.M))
    assert set(SCRIPTS) <= listed, sorted(set(SCRIPTS) - listed)
