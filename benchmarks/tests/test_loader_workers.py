"""benchmarks/loader_workers.py on a tiny configuration: one row per case and worker count, rates from the
samples and seconds the rows carry, every sample of the pack delivered, and its argument errors."""

import pytest

from benchmarks import loader_workers


def _load(monkeypatch):
    return loader_workers


def test_loader_workers_table(capsys, monkeypatch):
    example = _load(monkeypatch)
    rows = example.main(["--samples", "40", "--size", "32", "--workers", "0", "--epochs", "1"])
    cases = ["default pack, vector decoder", "default pack, scalar decoder", "--lossless zstd pack"]
    assert [(r["case"], r["workers"]) for r in rows] == [(c, 0) for c in cases]
    assert all(r["samples"] == 40 and r["seconds"] > 0 for r in rows)
    table = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in table[0]] == ["case", "workers", "samples/s", "µs per sample"]
    for r, cells in zip(rows, table[1:], strict=True):
        assert cells[0].strip() == r["case"]
        assert float(cells[2]) == pytest.approx(r["samples"] / r["seconds"], abs=0.5)


@pytest.mark.parametrize("argv", [["--samples", "8"], ["--epochs", "0"], ["--workers", "-1"], ["--size", "8"]])
def test_loader_workers_rejects_bad_arguments(argv, monkeypatch):
    example = _load(monkeypatch)
    with pytest.raises(SystemExit, match="expected"):
        example.main(argv)
