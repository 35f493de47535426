"""CLI basics: demo and codec bench produce their tables; errors are one line without traceback."""

import re

import pytest

from dctdata import fused
from dctdata.cli import main


def test_codec_bench_reports_ratios_against_copy_in_and_out_of_cache_and_paper(capsys):
    args = [
        "bench",
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


def test_unknown_command_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_a_mistyped_flag_names_the_flag_it_most_likely_meant(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["pack", "x.npy", "out", "--target-psrn", "40"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: dctdata pack" in err  # the command's own usage, not the top-level one
    assert (
        "dctdata pack: error: unrecognized arguments: --target-psrn 40 (--target-psrn: did you mean --target-psnr?)"
        in err
    )
    with pytest.raises(SystemExit):
        main(["info", "x", "--zzz"])
    err = capsys.readouterr().err
    assert "dctdata info: error: unrecognized arguments: --zzz" in err and "did you mean" not in err


def test_library_errors_become_one_line_without_traceback(capsys):
    # cf out of range through a real command path
    assert main(["bench", "codec", "--sizes", "64", "--paper-sizes", "64", "--cf", "9", "--repeat", "1"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"dctdata bench: error: cf: expected an int in 1\.\.8\. Got 9\n", err)


@pytest.mark.parametrize("kind", ["codec", "rd", "loader", "stream"])
def test_bench_help_has_a_description_and_every_default(kind, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", kind, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert usage.startswith(f"usage: dctdata bench {kind}") and len(description.split()) >= 5
    blocks = re.split(r"\n(?=  --)", out.split("options:", 1)[1])[1:]  # one per option, help lines included
    assert len(blocks) >= 4
    for block in blocks:
        assert "(default:" in block, f"{block.split()[0]} shows no default"
