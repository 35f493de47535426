"""CLI basics: unknown commands get the usage, errors are one line without traceback, and `dctdata bench`
says where the benchmarks went."""

import re

import numpy as np
import pytest

from dctdata.cli import main


def test_unknown_command_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_library_errors_become_one_line_without_traceback(tmp_path, capsys):
    # cf out of range through a real command path
    np.save(tmp_path / "x.npy", np.zeros((2, 8, 8), np.float32))
    assert main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "out"), "--cf", "9", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"dctdata pack: error: cf: expected an int in 1\.\.8\. Got 9\n", err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, kind", [(["bench"], "NAME"), (["bench", "rd", "--items", "mri"], "rd")])
def test_bench_points_to_the_benchmarks_folder(argv, kind, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("dctdata bench: error: the benchmarks are not part of the installed package: ")
    assert f"`python -m benchmarks {kind}` from the root of a dctdata checkout" in err
