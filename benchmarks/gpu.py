"""`python -m benchmarks gpu`: `Decompress` on an accelerator, and the whole loader path to it.

Two tables:
- decode: `Decompress` GB/s of decoded output for each CF at each square size, in float32 (the
  default layer) and bfloat16 (`Decompress(spec, dtype=torch.bfloat16).to(torch.bfloat16)`: weights,
  arithmetic and output in bf16), int8 coefficients in, batches of about 64 MB of output, timed with
  CUDA events after warm-up (wall clock off CUDA). Codec "v1" folds dequantization into the weights;
  "v2" is what a calibrated single-channel pack carries (dead-zone reconstruction offsets and a
  per-sample (range, mid) side input), which adds elementwise work before the first matmul.
- pipeline: samples/s from local packs of one synthetic set (`benchmarks.loader.synthetic`)
  through `make_loader(..., pin_memory=True)` and `DevicePrefetcher` to the float32 model input on
  the device: dctdata zarr coefficients -> `Decompress` (the default entropy-coded pack, and the
  same settings with `--lossless zstd` (zstd-19), which stores more and decodes faster in the workers);
  raw float32 rows -> host-to-device copy; JPEG files at the first quality that reaches dctdata's median PSNR ->
  `torchvision.io.decode_jpeg(device=...)` (nvJPEG on CUDA), the loader moving the encoded bytes.
  Bytes to device per sample and the transfer ratio (float32 bytes over them) are counted.

Without CUDA the command prints one line and exits 0. The functions take any device, so the tests
run the table code on the CPU.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import torch

from dctdata.layer import Decompress
from dctdata.spec import CodecSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BATCH_BYTES = 64 << 20


def skip_reason(device: str) -> str | None:
    """Why the benchmark cannot run on `device` (None when it can)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device: torch.device, repeat: int) -> float:
    """Best time of one call of `fn` on `device`, after two warm-up calls."""
    for _ in range(2):
        fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
    return best


def _int8_spec(cf: int, size: int) -> CodecSpec:
    k = cf * cf
    return CodecSpec(cf=cf, height=size, width=size, dtype="int8", steps=((0.05,) * k,), offsets=((0.0,) * k,))


def _v2_spec(cf: int, size: int) -> CodecSpec:
    """A calibrated single-channel pack's codec: dead zone, reconstruction offsets, per-sample side."""
    k = cf * cf
    return CodecSpec(cf=cf, height=size, width=size, dtype="int8", steps=((0.002,) * k,), offsets=((0.0,) * k,),
                     theta=0.4, recon=((0.1,) * k,), side="range_mid")  # fmt: skip


def _wire(spec: CodecSpec, batch: int, dev: torch.device):
    coeffs = torch.randint(-100, 100, (batch, *spec.coeff_shape), dtype=torch.int8, device=dev)
    if spec.side is None:
        return coeffs
    side = torch.stack([torch.full((batch, spec.channels), 290.0), torch.full((batch, spec.channels), 40.0)], -1)
    return coeffs, side.to(dev)


def decode_rows(device="cuda", sizes=(256, 512, 1024, 2048), cfs=(2, 4, 6, 8), dtypes=("float32", "bfloat16"),
                repeat=20, batch_bytes=BATCH_BYTES, codecs=("v1", "v2")) -> list[dict]:  # fmt: skip
    """Rows: size, cf, dtype, codec, batch, ms per batch, output GB/s, Gpixel/s."""
    dev = torch.device(device)
    rows = []
    for size in sizes:
        for cf in cfs:
            for name in dtypes:
                for codec in codecs:
                    spec = _int8_spec(cf, size) if codec == "v1" else _v2_spec(cf, size)
                    dtype = DTYPES[name]
                    layer = Decompress(spec, dtype=dtype).to(device=dev, dtype=dtype)
                    item = torch.empty((), dtype=dtype).element_size()
                    batch = max(1, batch_bytes // (size * size * item))
                    wire = _wire(spec, batch, dev)
                    with torch.inference_mode():
                        t = _seconds(lambda layer=layer, wire=wire: layer(wire), dev, repeat)
                    pixels = batch * size * size
                    rows.append(
                        {
                            "size": size,
                            "cf": cf,
                            "dtype": name,
                            "codec": codec,
                            "batch": batch,
                            "ms": 1e3 * t,
                            "GBps": pixels * item / t / 1e9,
                            "Gpix": pixels / t / 1e9,
                        }
                    )
                    del layer, wire
    return rows


class _Rows(torch.utils.data.Dataset):
    """Rows of a .npy file (memory-mapped once per process), batched by `__getitems__`."""

    def __init__(self, path: str) -> None:
        self.path, self._x, self._pid = path, None, None
        self.n = len(np.load(path, mmap_mode="r", allow_pickle=False))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_x": None, "_pid": None}

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, idx):
        if self._pid != os.getpid():
            self._x, self._pid = np.load(self.path, mmap_mode="r", allow_pickle=False), os.getpid()
        return [torch.from_numpy(np.array(self._x[i])) for i in idx]

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


class _EncodedFiles(torch.utils.data.Dataset):
    def __init__(self, files) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i) -> bytes:
        with open(self.files[i], "rb") as fh:
            return fh.read()  # bytes, not a tensor per sample: workers pass one pickle per batch


def _as_list(batch):
    return list(batch)


def pipeline_rows(device="cuda", n=2048, size=256, batch=32, workers=2, epochs=2, target_psnr=40.0) -> list[dict]:
    """Rows: pipeline, samples/s (best of `epochs`), stored bytes per sample, median PSNR."""
    import torchvision.io as tio

    import dctdata
    from benchmarks.loader import jpeg_files, synthetic
    from dctdata.loaders.device import DevicePrefetcher
    from dctdata.loaders.distributed import make_loader
    from dctdata.lossless import parse_lossless_option

    dev = torch.device(device)
    pin = dev.type == "cuda"
    x = synthetic(n, size)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "x.npy"), x)
        out = os.path.join(tmp, "dct")
        dctdata.pack(os.path.join(tmp, "x.npy"), out, quant="int8", target_psnr=target_psnr, quiet=True)
        ds = dctdata.open_dataset(out)
        layer = ds.decompressor().to(dev)
        out_zstd = os.path.join(tmp, "dct_zstd")  # the same settings, `--lossless zstd` instead of the entropy coder
        zstd_stage = parse_lossless_option("zstd")
        dctdata.pack(os.path.join(tmp, "x.npy"), out_zstd, quant="int8", target_psnr=target_psnr, quiet=True,
                     codec=zstd_stage)  # fmt: skip
        ds_zstd = dctdata.open_dataset(out_zstd)
        zstd_name = f"dctdata zarr ({ds_zstd.manifest.field('image').codec.dtype}, zstd-{zstd_stage['level']})"
        zstd_name += " -> Decompress"
        q, jpgs, jpeg_psnr = jpeg_files(
            x[:, 0].astype(np.uint8), os.path.join(tmp, "jpg"), ds.manifest.stats["image"].psnr_median
        )

        def jpeg_decode(files):
            images = tio.decode_jpeg([torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files], device=dev)
            return torch.stack(images).float()

        cases = [
            (f"dctdata zarr ({ds.manifest.field('image').codec.dtype}) -> Decompress", ds, None, lambda b: layer(b[0]),
             _bytes(out, n), ds.manifest.stats["image"].psnr_median),
            ("raw float32 -> host-to-device copy", _Rows(os.path.join(tmp, "x.npy")), None, lambda b: b,
             x[0].nbytes, float("inf")),
            (f"JPEG q={q} -> torchvision decode_jpeg(device)", _EncodedFiles(jpgs), _as_list, jpeg_decode,
             _bytes(os.path.join(tmp, "jpg"), n), jpeg_psnr),
            (zstd_name, ds_zstd, None,
             lambda b: layer(b[0]), _bytes(out_zstd, n), ds_zstd.manifest.stats["image"].psnr_median),
        ]  # fmt: skip
        for name, dataset, collate, to_input, stored, quality in cases:
            kw = {"collate_fn": collate} if collate else {}
            loader = make_loader(
                dataset, batch, num_workers=workers, pin_memory=pin, persistent_workers=workers > 0, **kw
            )
            best, moved = 0.0, 0
            for epoch in range(epochs):
                loader.sampler.set_epoch(epoch)
                count, moved, t0 = 0, 0, time.perf_counter()
                with torch.inference_mode():
                    for b in DevicePrefetcher(loader, dev, pin_memory=False) if collate is None else loader:
                        count += to_input(b).shape[0]
                        moved += _nbytes(b)
                _sync(dev)
                best = max(best, count / (time.perf_counter() - t0))
            rows.append({"pipeline": name, "sps": best, "bytes": stored, "moved": moved / count, "psnr": quality})
    return rows


def _nbytes(batch) -> int:
    """Bytes of a batch as it crosses to the device (tensors, or the encoded bytes nvJPEG decodes there)."""
    if isinstance(batch, torch.Tensor):
        return batch.nbytes
    if isinstance(batch, (bytes, bytearray)):
        return len(batch)
    if isinstance(batch, (list, tuple)):
        return sum(_nbytes(b) for b in batch)
    if isinstance(batch, dict):
        return sum(_nbytes(b) for b in batch.values())
    return 0


def _bytes(root: str, n: int) -> float:
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f != "manifest.json")
    return total / n


def format_decode_rows(rows) -> str:
    lines = [
        "| size | CF | dtype | codec | batch | ms/batch | GB/s out | Gpixel/s |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']}² | {r['cf']} | {r['dtype']} | {r['codec']} | {r['batch']} | {r['ms']:.3f} | "
            f"{r['GBps']:.1f} | {r['Gpix']:.2f} |"
        )
    return "\n".join(lines)


def format_pipeline_rows(rows) -> str:
    base = rows[0]["sps"]
    lines = [
        "| pipeline | samples/s | vs dctdata | stored bytes/sample | bytes/sample to device | transfer ratio "
        "(float32 / to device) | median PSNR dB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        q = "lossless" if r["psnr"] == float("inf") else f"{r['psnr']:.1f}"
        ratio = rows[1]["moved"] / r["moved"]
        lines.append(
            f"| {r['pipeline']} | {r['sps']:.0f} | {r['sps'] / base:.2f}x | {r['bytes']:.0f} | {r['moved']:.0f} | "
            f"{ratio:.1f}x | {q} |"
        )
    return "\n".join(lines)
