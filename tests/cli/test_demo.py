"""`dctdata demo`: the end-to-end table (raw vs zarr vs webdataset) on tiny settings, --out, errors."""

import json
import re

import pytest

from dctdata.cli import main
from dctdata.demo import RESULT_COLUMNS, DemoSettings, run_demo

TINY = [
    "--n",
    "8",
    "--test",
    "2",
    "--size",
    "32",
    "--crop",
    "16",
    "--epochs",
    "3",
    "--batch-size",
    "4",
    "--width",
    "4",
    "--quiet",
]


def _table(out: str) -> list[list[str]]:
    lines = [line for line in out.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_demo_prints_one_table_and_packed_losses_decrease(capsys, tmp_path):
    assert main(["demo", *TINY, "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    table = _table(out)
    assert table[0] == list(RESULT_COLUMNS)
    rows = {r[0]: r for r in table[2:]}
    assert list(rows) == ["raw float32", "dctdata zarr", "dctdata webdataset"]
    for name in ("dctdata zarr", "dctdata webdataset"):
        r = dict(zip(RESULT_COLUMNS, rows[name]))
        # int8 coefficients + zstd; the webdataset pack of 8 tiny samples is 8 one-sample shards (the loader rule:
        # >= 16 shards or one per sample), each padded to a 10 KiB tar record, so only zarr is compared with 1.5
        assert float(r["stored ratio vs float32"]) > (1.5 if "zarr" in name else 0.5)
        assert float(r["transfer ratio"]) >= 4.0 - 1e-9  # int8 is 4x smaller than float32 at any CF
        lo, med = (float(v) for v in r["PSNR min/median dB"].split("/"))
        assert 30 < lo <= med
        first, final = (float(v) for v in r["train loss first → final"].split("→"))
        assert final < first
    assert rows["raw float32"][1:5] == ["0.07", "1.00", "1.00", "exact"]  # 8 pairs of 2x32x32 float32
    # every ratio column is defined, and the zarr-vs-webdataset gap is called what it is: training noise
    assert "transfer ratio: float32 bytes of the model input / bytes the DataLoader moves" in out
    gap = abs(float(rows["dctdata zarr"][-1]) - float(rows["dctdata webdataset"][-1]))
    assert re.search(rf"test-MSE gap \({gap:.5f}\) is the run-to-run noise", out)
    # --out keeps the artifacts and the same numbers as JSON
    kept = {p.name for p in (tmp_path / "demo").iterdir()}
    assert {"em_train.npz", "em.zarr", "em.wds", "results.md", "results.json"} <= kept
    result = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert [r["data"] for r in result["rows"]] == list(rows)
    assert all(len(r["losses"]) == 3 for r in result["rows"])
    assert re.search(r"wall time [\d.]+ s; artifacts kept in ", out)


def test_demo_runs_on_its_own_threads_and_explains_the_loader_rates(capsys, monkeypatch):
    import torch

    before = torch.get_num_threads()
    seen = []
    import dctdata.demo.pipeline as pipeline

    real = pipeline._run
    monkeypatch.setattr(pipeline, "_run", lambda *a: (seen.append(torch.get_num_threads()), real(*a))[1])
    assert main(["demo", *TINY]) == 0
    assert seen == [1] and torch.get_num_threads() == before  # one thread while it runs, put back after
    out = capsys.readouterr().out
    assert "CPU threads 1" in out
    assert "The raw row only indexes float32 tensors already in memory (no file, no decode)" in out
    assert "the packed rows read their files and run the lossless stage" in out
    assert main(["demo", *TINY, "--threads", "0"]) == 1
    assert "--threads: expected an integer >= 1" in capsys.readouterr().err


def test_demo_without_out_removes_its_work_directory(tmp_path):
    result = run_demo(DemoSettings(n=4, test=1, size=16, crop=8, epochs=1, batch_size=2, width=2), quiet=True)
    assert result["rows"][1]["data"] == "dctdata zarr"
    assert not __import__("os").path.exists(result["work"])


def test_demo_refuses_a_non_empty_out(capsys, tmp_path):
    (tmp_path / "x").write_text("keep me")
    assert main(["demo", *TINY, "--out", str(tmp_path)]) == 1
    assert re.search(r"dctdata demo: error: --out .*: expected a new or empty directory", capsys.readouterr().err)
    assert (tmp_path / "x").read_text() == "keep me"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--size", "20"], r"--size: expected a multiple of 8"),
        (["--crop", "64"], r"--crop: expected a multiple of 8 no larger than --size 32"),
        (["--epochs", "0"], r"--epochs: expected an integer >= 1"),
        (["--target-psnr", "-3"], r"--target-psnr: expected dB in \(0, 200\)"),
    ],
)
def test_demo_bad_settings_are_one_line_errors(capsys, flags, message):
    assert main(["demo", *TINY, *flags]) == 1
    assert re.search(message, capsys.readouterr().err)


def test_train_weights_each_epoch_loss_by_samples_when_the_input_is_a_wire_pair():
    # A packed run's input is a (coefficients, side) pair: the epoch's mean loss must count the batch's samples
    # (the target's length), not the pair's two members, so a short last batch weighs what it holds.
    import torch
    from torch import nn

    from dctdata.demo.pipeline import train

    class PairNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, pair):
            return pair[0] * self.w

    batches = [torch.full((3, 1, 8, 8), 1.0), torch.full((1, 1, 8, 8), 3.0)]  # per-batch MSE 1 and 9
    losses = train(
        PairNet(),
        lambda epoch: batches,
        lambda batch, top, left: ((batch, torch.zeros(len(batch), 1, 2)), torch.zeros_like(batch)),
        DemoSettings(size=8, crop=8, epochs=1, lr=0.0),
        lambda: None,
    )
    assert losses == [pytest.approx((3 * 1.0 + 1 * 9.0) / 4)]  # the mean over pairs' members would be 5
