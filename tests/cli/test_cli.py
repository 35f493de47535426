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


@pytest.mark.parametrize("argv", [["--help"], ["info", "--help"], ["verify", "--help"]])
def test_help_and_light_commands_start_without_torch(argv):
    """`dctdata --help` lists every command without importing torch (pack's and demo's modules import it)."""
    import subprocess
    import sys

    probe = (
        "import sys, dctdata.cli as c\ntry:\n    c.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")
    if argv == ["--help"]:
        assert all(f"    {name} " in out for name in ("pack", "demo", "info", "verify", "inspect"))


def test_pack_help_still_lists_every_setting(capsys):
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    out = capsys.readouterr().out
    assert "--target-psnr" in out and "--quant" in out and "--workers" in out


def test_a_mistyped_command_is_refused_by_the_whole_parser(capsys):
    with pytest.raises(SystemExit):
        main(["pakc", "x.npy", "o.dct"])
    assert "invalid choice: 'pakc'" in capsys.readouterr().err


def test_pack_shows_a_line_before_its_modules_load_on_a_terminal(tmp_path, monkeypatch, capsys):
    import sys

    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(3, 16, 16)).astype(np.float32))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "o.dct"), "--cf", "4", "--quant", "int16"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("\rpack: starting (loading torch)\r" + " " * 30 + "\r") and "B/s" in err
    main(["pack", str(tmp_path / "x.npy"), str(tmp_path / "q.dct"), "--cf", "4", "--quant", "int16", "--quiet"])
    assert capsys.readouterr().err == ""  # --quiet: no line
