"""The `dctdata demo` pipeline, end to end on a synthetic EM denoising set.

generate (em_denoise-like pairs, float32 1xHxW) -> pack zarr + webdataset at a target PSNR ->
stream with a DataLoader -> `Decompress` as the network's first layer -> train a small denoiser;
the same denoiser (same initialisation, same crops) is trained on the raw float32 arrays, and all
three are scored on held-out raw pairs. `run_demo` returns the rows of the one table the command
prints; the command module does the printing.

Training uses random crops taken on whole 8x8 blocks of the coefficient tensor, before the
`Decompress` layer: the DCT is block-local, so decoding the cropped coefficients gives exactly the
crop of the decoded image, and the model decodes only what it trains on. The raw run takes the
same crops of the raw arrays.

This is not core code: it joins the pack (`dctdata.preprocess`), the loaders and the first layer
the way a user's training script would.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from dctdata.decoder.layer import Decompress
from dctdata.errors import DctDataError
from dctdata.parse import parse_int
from dctdata.report import pack_summary

FIELDS = ("noisy", "clean")
# The demo's source is float32, so the stored ratio is against float32 and the source at once (one
# column); the transfer ratio is defined in `table_notes`.
RESULT_COLUMNS = (
    "data",
    "stored MB",
    "stored ratio vs float32",
    "transfer ratio",
    "PSNR min/median dB",
    "loader samples/s",
    "decode samples/s",
    "train loss first → final",
    "test MSE",
)


@dataclasses.dataclass
class DemoSettings:
    """Knobs of the demo (the CLI flags). Defaults run in well under two minutes on 2 CPU cores."""

    n: int = 64  # training pairs that are packed
    test: int = 8  # held-out raw pairs the three networks are scored on
    size: int = 256  # image side (the SciML-Bench em_graphene_sim size)
    crop: int = 96  # training crop side (multiple of 8; = size for whole images)
    epochs: int = 6
    batch_size: int = 8
    target_psnr: float = 40.0
    quant: str = "int8"
    width: int = 16  # denoiser channels
    lr: float = 3e-3
    seed: int = 0
    threads: int = 1  # torch (and Blosc) threads for the whole run; see `run_demo`

    def check(self) -> None:
        for name in ("n", "test", "size", "crop", "epochs", "batch_size", "width", "threads"):
            parse_int(
                getattr(self, name),
                f"--{name.replace('_', '-')}",
                minimum=1,
                expected="an integer >= 1",
                type_error=DctDataError,
            )
        if self.size % 8 or self.size < 16:
            raise DctDataError(f"--size: expected a multiple of 8, at least 16. Got {self.size}")
        if self.crop % 8 or self.crop > self.size:
            raise DctDataError(f"--crop: expected a multiple of 8 no larger than --size {self.size}. Got {self.crop}")
        if not (isinstance(self.target_psnr, (int, float)) and 0 < self.target_psnr < 200):
            raise DctDataError(f"--target-psnr: expected dB in (0, 200). Got {self.target_psnr!r}")


class Denoiser(nn.Module):
    """A small DnCNN-like residual denoiser: clean = noisy - body(noisy). Fully convolutional."""

    def __init__(self, width: int = 16, channels: int = 1) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, channels, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.body(x)


# Data ----------------------------------------------------------------------------------------------
def make_pairs(n: int, size: int, seed: int) -> dict[str, npt.NDArray[np.float32]]:
    """{'noisy', 'clean'}: (n, 1, size, size) float32 em_denoise-like pairs."""
    from dctdata.datasets import em_denoise

    ds = em_denoise(n=n, size=size, seed=seed)
    samples = [ds[i] for i in range(n)]
    return {k: np.stack([s[k] for s in samples]) for k in FIELDS}


# Loading -------------------------------------------------------------------------------------------
def loader_speed(loader: Iterable[Any], decode: Callable[[Any], Any] | None) -> tuple[float, float]:
    """(DataLoader samples/s, decode samples/s) over one pass; decode is timed separately."""
    n, t_decode = 0, 0.0
    t0 = time.perf_counter()
    for batch in loader:
        first = batch[0][0] if isinstance(batch[0], (tuple, list)) else batch[0]  # a (coefficients, side) pair
        b = len(first)
        if decode is not None:
            t = time.perf_counter()
            with torch.no_grad():
                decode(batch)
            t_decode += time.perf_counter() - t
        n += b
    total = time.perf_counter() - t0
    load = total - t_decode
    return n / max(load, 1e-9), (n / t_decode if decode is not None and t_decode > 0 else math.nan)


# Training ------------------------------------------------------------------------------------------
def crop_offsets(gen: torch.Generator, blocks: int, crop_blocks: int) -> tuple[int, int]:
    top, left = torch.randint(0, blocks - crop_blocks + 1, (2,), generator=gen).tolist()
    return top, left


def crop_coeffs(wire: Any, top: int, left: int, nb: int) -> Any:
    """Crop (B, C, Hb, K, Wb) coefficients to nb x nb blocks: the blocks of an (8nb)^2 image crop (the
    per-sample side information of a (coefficients, side) pair is the same for the crop)."""
    if isinstance(wire, (tuple, list)):
        return (crop_coeffs(wire[0], top, left, nb), wire[1])
    return wire[:, :, top : top + nb, :, left : left + nb]


def crop_pixels(x: torch.Tensor, top: int, left: int, nb: int) -> torch.Tensor:
    return x[..., 8 * top : 8 * (top + nb), 8 * left : 8 * (left + nb)]


def train(
    net: nn.Module,
    batches: Callable[[int], Iterable[Any]],
    to_pair: Callable[[Any, int, int], tuple[Any, torch.Tensor]],
    s: DemoSettings,
    tick: Callable[[], None],
) -> list[float]:
    """Train for `s.epochs`; `to_pair(batch, top, left)` -> (input, target) for a crop: the input is the network's
    (a wire value, possibly a (coefficients, side) pair, for a packed run), the target a batch of tensors. Returns
    the mean loss per sample of every epoch. The crop sequence depends only on the seed, so runs are comparable."""
    opt = torch.optim.Adam(net.parameters(), lr=s.lr)
    gen = torch.Generator().manual_seed(s.seed)
    blocks, nb = s.size // 8, s.crop // 8
    losses: list[float] = []
    for epoch in range(s.epochs):
        net.train()
        total, count = 0.0, 0
        for batch in batches(epoch):
            top, left = crop_offsets(gen, blocks, nb)
            x, y = to_pair(batch, top, left)
            loss = nn.functional.mse_loss(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(y)  # the target's batch: x can be a (coefficients, side) pair
            count += len(y)
        losses.append(total / count)
        tick()
    return losses


def test_mse(denoiser: nn.Module, test: dict[str, npt.NDArray[np.float32]]) -> float:
    """MSE of the denoiser on held-out raw pairs (whole images, no compression anywhere)."""
    denoiser.eval()
    with torch.no_grad():
        x, y = torch.from_numpy(test["noisy"]), torch.from_numpy(test["clean"])
        return float(nn.functional.mse_loss(denoiser(x), y))


# The demo ------------------------------------------------------------------------------------------
def run_demo(s: DemoSettings, out: str | None = None, quiet: bool = False) -> dict[str, Any]:
    """Run the whole demo; returns {'rows': [...], 'settings': ..., 'noisy_mse': ..., 'seconds': ...}.

    out: a directory that does not exist yet (or is empty) to keep the source, both packs and the
    results; None works in a temporary directory that is removed afterwards.

    Threads: the run uses `s.threads` torch and Blosc threads (default 1) and puts the previous counts
    back at the end. Its tensors are small (batches of 8 crops of 96 x 96, one 16-channel network), so
    extra intra-op threads gain little, and torch's default of one per core made the demo several times
    slower on a loaded machine (docs/benchmarks/design.md): the pool's threads wait on each other whenever
    another process holds a core.
    """
    s.check()
    threads = torch.get_num_threads()
    torch.set_num_threads(s.threads)
    blosc_threads = _set_blosc_threads(s.threads)
    try:
        return _run_in(s, out, quiet)
    finally:
        torch.set_num_threads(threads)
        _set_blosc_threads(blosc_threads)


def _set_blosc_threads(n: int | None) -> int | None:
    """Blosc's thread count set to n (None: left as is); returns the previous one (None without Blosc)."""
    try:
        from numcodecs import blosc
    except ImportError:  # pragma: no cover - numcodecs built without Blosc
        return None
    return blosc.set_nthreads(n) if n is not None else None


def _run_in(s: DemoSettings, out: str | None, quiet: bool) -> dict[str, Any]:
    if out is not None:
        out = os.path.abspath(os.fspath(out))
        if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
            raise DctDataError(f"--out {out}: expected a new or empty directory. Got an existing non-empty path")
        os.makedirs(out, exist_ok=True)
        return _run(s, out, quiet)
    with tempfile.TemporaryDirectory(prefix="dctdata-demo-") as work:
        return _run(s, work, quiet)


def _run(s: DemoSettings, work: str, quiet: bool) -> dict[str, Any]:
    from tqdm.auto import tqdm

    import dctdata
    from dctdata.loaders.wds_dataset import DCTWebDataset

    t_start = time.perf_counter()
    torch.manual_seed(s.seed)
    steps = 3 + 3 + 3 * s.epochs  # generate+2 packs, 3 loader passes, training epochs
    bar = tqdm(total=steps, desc="demo", unit="step", disable=quiet, leave=False)

    timings: dict[str, float] = {}
    since, current = time.perf_counter(), ""  # the running stage ("" before the first) and its start

    def stage(desc: str) -> None:
        nonlocal since, current
        now = time.perf_counter()
        if current:
            timings[current] = timings.get(current, 0.0) + now - since
        since, current = now, desc
        bar.set_description(f"demo: {desc}")

    try:
        stage("generate")
        train_np = make_pairs(s.n, s.size, s.seed)
        test_np = make_pairs(s.test, s.size, s.seed + 1)
        source = os.path.join(work, "em_train.npz")
        np.savez(source, **cast("dict[str, Any]", train_np))  # numpy 2.4's stubs read ** as allow_pickle too
        bar.update()

        packs: dict[str, tuple[str, Any, float]] = {}
        kwargs: dict[str, Any] = dict(target_psnr=float(s.target_psnr), quant=s.quant, mask="square", quiet=True)
        for fmt, name in (("zarr", "em.zarr"), ("webdataset", "em.wds")):
            stage(f"pack {fmt}")
            path = os.path.join(work, name)
            t = time.perf_counter()
            manifest = dctdata.pack(source, path, format=fmt, **kwargs)
            packs[fmt] = (path, manifest, time.perf_counter() - t)
            bar.update()

        # DataLoaders: raw arrays in memory vs the two packs, same batch size, no workers.
        raw_ds = torch.utils.data.TensorDataset(
            torch.from_numpy(train_np["noisy"]), torch.from_numpy(train_np["clean"])
        )
        zarr_ds = dctdata.open_dataset(packs["zarr"][0])
        wds_ds = dctdata.open_dataset(packs["webdataset"][0], seed=s.seed)

        def loader(kind: str, epoch: int = 0) -> torch.utils.data.DataLoader[Any]:
            if kind == "raw":
                g = torch.Generator().manual_seed(s.seed * 1000 + epoch)
                return torch.utils.data.DataLoader(raw_ds, batch_size=s.batch_size, shuffle=True, generator=g)
            ds = {"zarr": zarr_ds, "webdataset": wds_ds}[kind]
            if isinstance(ds, DCTWebDataset):  # streamed: the epoch orders its shards
                ds.set_epoch(epoch)
                return torch.utils.data.DataLoader(ds, batch_size=s.batch_size)
            g = torch.Generator().manual_seed(s.seed * 1000 + epoch)
            return torch.utils.data.DataLoader(ds, batch_size=s.batch_size, shuffle=True, generator=g)

        decoders = {k: {f: ds.decompressor(f) for f in FIELDS} for k, ds in (("zarr", zarr_ds), ("webdataset", wds_ds))}

        def decode_all(kind: str) -> Callable[[Any], list[torch.Tensor]]:
            return lambda batch: [decoders[kind][f](q) for f, q in zip(FIELDS, batch)]

        speed: dict[str, tuple[float, float]] = {}
        for kind in ("raw", "zarr", "webdataset"):
            stage(f"loader {kind}")
            speed[kind] = loader_speed(loader(kind), None if kind == "raw" else decode_all(kind))
            bar.update()

        # Training: the same initial weights and crop sequence for all three.
        init = Denoiser(s.width)
        runs: dict[str, dict[str, Any]] = {}
        nb = s.crop // 8
        for kind in ("raw", "zarr", "webdataset"):
            stage(f"train {kind}")
            den = Denoiser(s.width)
            den.load_state_dict(init.state_dict())
            to_pair: Callable[[Any, int, int], tuple[Any, torch.Tensor]]
            if kind == "raw":
                model: nn.Module = den

                def raw_pair(batch: Any, top: int, left: int) -> tuple[torch.Tensor, torch.Tensor]:
                    return crop_pixels(batch[0], top, left, nb), crop_pixels(batch[1], top, left, nb)

                to_pair = raw_pair
            else:
                specs = {f: packs[kind][1].field(f).codec for f in FIELDS}
                crop_specs = {f: sp.replace(height=s.crop, width=s.crop) for f, sp in specs.items()}
                # The network the packed data trains: Decompress is its first layer.
                model = nn.Sequential(Decompress(crop_specs["noisy"]), den)
                target = Decompress(crop_specs["clean"])

                def packed_pair(
                    batch: Any, top: int, left: int, target: Decompress = target
                ) -> tuple[Any, torch.Tensor]:
                    return crop_coeffs(batch[0], top, left, nb), target(crop_coeffs(batch[1], top, left, nb))

                to_pair = packed_pair
            losses = train(model, functools.partial(loader, kind), to_pair, s, bar.update)
            runs[kind] = {"losses": losses, "test_mse": test_mse(den, test_np)}
        stage("done")
    finally:
        bar.close()

    n_f32 = s.n * len(FIELDS) * s.size * s.size * 4
    rows = [
        {
            "data": "raw float32",
            "stored_bytes": n_f32,
            "ratio_f32": 1.0,
            "ratio_src": 1.0,
            "transfer": 1.0,
            "psnr_min": math.inf,
            "psnr_median": math.inf,
            "loader_sps": speed["raw"][0],
            "decode_sps": math.nan,
            "losses": runs["raw"]["losses"],
            "test_mse": runs["raw"]["test_mse"],
        }
    ]
    for kind in ("zarr", "webdataset"):
        path, manifest, seconds = packs[kind]
        row = {"data": f"dctdata {kind}", **pack_summary(manifest), "pack_seconds": seconds}
        row.update(loader_sps=speed[kind][0], decode_sps=speed[kind][1], **runs[kind])
        rows.append(row)
    with torch.no_grad():
        noisy_mse = float(
            nn.functional.mse_loss(torch.from_numpy(test_np["noisy"]), torch.from_numpy(test_np["clean"]))
        )
    result = {
        "settings": dataclasses.asdict(s),
        "rows": rows,
        "noisy_mse": noisy_mse,
        "seconds": time.perf_counter() - t_start,
        "stage_seconds": timings,
        "work": work,
    }
    with open(os.path.join(work, "results.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=_json_default)
    with open(os.path.join(work, "results.md"), "w") as fh:
        fh.write(format_table(rows) + "\n\n" + "\n".join(table_notes(result)) + "\n")
    return result


def table_notes(result: dict[str, Any]) -> list[str]:
    """What the table's columns mean, and how far apart two runs on the same data land."""
    rows = {r["data"]: r for r in result["rows"]}
    packed = [rows[k]["test_mse"] for k in ("dctdata zarr", "dctdata webdataset") if k in rows]
    notes = [
        "stored ratio: float32 bytes of the set / bytes stored; transfer ratio: float32 bytes of the model input / "
        "bytes the DataLoader moves per sample (coefficients in the wire dtype), i.e. what host-to-device copies save.",
        f"test MSE: on {result['settings']['test']} held-out raw pairs (the noisy input itself scores "
        f"{result['noisy_mse']:.5f}); PSNR: worst field's min / median from the manifest.",
        "loader samples/s: one pass of a DataLoader in this process (num_workers=0), nothing else timed. The raw "
        "row only indexes float32 tensors already in memory (no file, no decode), so it is an upper bound no "
        "stored format reaches; the packed rows read their files and run the lossless stage (the entropy "
        "coder or zstd) for every batch, on one core. In training, DataLoader workers do that reading beside "
        "the model (make_loader(..., num_workers=N)), and what a step waits for is storage or the network, "
        "where the packed rows move their stored MB instead of the raw one's. decode samples/s: Decompress of "
        "both fields on the CPU (on an accelerator it is part of the model's first layer).",
    ]
    if len(packed) == 2:
        notes.append(
            f"zarr and webdataset hold the same coefficients and differ only in batch order: their test-MSE gap "
            f"({abs(packed[0] - packed[1]):.5f}) is the run-to-run noise of this small training, so a raw-vs-packed "
            "difference of that size says nothing about the codec's quality."
        )
    return notes


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _num(v: float, fmt: str, missing: str = "—") -> str:
    return missing if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The demo's one markdown table (columns: RESULT_COLUMNS)."""
    lines = [
        "| " + " | ".join(RESULT_COLUMNS) + " |",
        "|" + "|".join([":--"] + ["--:"] * (len(RESULT_COLUMNS) - 1)) + "|",
    ]
    for r in rows:
        psnr = "exact" if math.isinf(r["psnr_min"]) else f"{r['psnr_min']:.1f} / {r['psnr_median']:.1f}"
        cells = [
            r["data"],
            f"{r['stored_bytes'] / 1e6:.2f}",
            f"{r['ratio_f32']:.2f}",
            f"{r['transfer']:.2f}",
            psnr,
            _num(r["loader_sps"], ".0f"),
            _num(r["decode_sps"], ".0f"),
            f"{r['losses'][0]:.5f} → {r['losses'][-1]:.5f}",
            f"{r['test_mse']:.5f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
