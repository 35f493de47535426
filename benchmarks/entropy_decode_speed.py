"""Issue 13, "decode MB/s per core next to zstd's": the entropy stage's decode speed beside zstd-9 and
zstd-19 on the same coefficients, with the bytes each stores.

    python -m benchmarks entropy-decode-speed [--sets em,atoms,beam,clouds,camera,astronaut] [--samples 64]
        [--size 256] [--target-psnr 40] [--repeat 5] [--quant int8|int16] [--json PATH]

Sets: `em` is the pipeline bench's field (`benchmarks.loader.synthetic`: the noisy micrographs of
`python -m benchmarks gpu`'s loader table); `atoms`, `beam`, `clouds` are the synthetic SciML fields of
`tests/sci_fields.py`; `camera` (grey) and `astronaut` (RGB) are scikit-image's shipped photos, cut
into size x size tiles. Each set is packed by the product (`dctdata.pack(..., target_psnr=T)`:
calibration, quantization and the fitted entropy model, zarr with one sample per chunk) and its stored
integer coefficients are read back (int8 where calibration reaches the target with int8 steps, as on
`em`; int16 otherwise; `--quant` forces one). Those coefficients, one stream per sample as the pack
stores them, are then coded by:

- `ctxrans`: the context-modelled rANS stage (`dctdata.entropy`), with the pack's fitted model (fitted
  here the same way when calibration chose zstd-19 for the pack: the "pack stage" column says which);
- `ctxrans 2-state`: the same model's streams in the layout version 1 packs store (mode 0: two 64-bit
  states), which the previous release wrote for every size and every release reads;
- `... no AVX2`: those two decoded with the kernel's vector paths switched off (`decoder_settings(simd=False)`), as on
  a CPU without AVX2; `ctxrans 2-state no AVX2` is the previous release's decoder's algorithm;
- `ctxrans, gather instruction` and `ctxrans, scalar loads`: the vector decoder with each way of making its
  table lookups (`decoder_settings(gather=...)`); the `ctxrans` row is this CPU's default, printed under the table;
- `zstd-9`, `zstd-19`: numcodecs' Zstd over the same coefficient bytes.

Decode is `dctdata.stages.Stage.decode`, the call the zarr and webdataset readers make per chunk, one
thread, best of `--repeat` passes over all samples (the coders alternate inside each pass, so they see
the same machine load). Every decoded array is checked against the coefficients. The `pack reader` row
is the whole worker-side read without torch, on one thread as in a DataLoader worker
(`DCTDATA_READ_THREADS=1`): `ZarrReader.read_samples` in batches of 32 samples (range
reads, crc32c, decode, gather). Columns: stored bytes per sample (stream only, the model in the
manifest is not counted), decode MB/s of float32-equivalent output (samples x C x H x W x 4 bytes / s,
per core) and M coefficients (symbols) per second, both from each coder's best pass; and each coder's speed
against `ctxrans, gather instruction` as the median over passes of their time ratio in the same pass (on a
shared machine the steadier comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

import dctdata
from dctdata.entropy import CtxCodec, _ctxrans
from dctdata.entropy.ctxrans import decoder_settings
from dctdata.stages import DEFAULT_CODEC, ZSTD_MAX, CtxransStage, get_stage

SETS = ("em", "atoms", "beam", "clouds", "camera", "astronaut")
CODERS = (
    "ctxrans",
    "ctxrans, gather instruction",
    "ctxrans, scalar loads",
    "ctxrans no AVX2",
    "ctxrans 2-state",
    "ctxrans 2-state no AVX2",
    "zstd-9",
    "zstd-19",
)
# coder -> (vector paths on, lookups by the gather instruction); None: the kernel's default for this CPU
KERNEL_SETTINGS = {
    "ctxrans no AVX2": (False, None),
    "ctxrans 2-state no AVX2": (False, None),
    "ctxrans, gather instruction": (True, True),
    "ctxrans, scalar loads": (True, False),
}
READER_BATCH = 32


def load_set(name: str, samples: int, size: int) -> np.ndarray:
    """float32 (N, C, size, size) samples of a set."""
    if name == "em":
        from benchmarks.loader import synthetic

        return synthetic(samples, size)
    if name in ("atoms", "beam", "clouds"):
        from sci_fields import synthetic_fields

        return synthetic_fields(n=samples, size=size, kinds=(name,))[name]
    if name in ("camera", "astronaut"):
        from shipped_images import sample_images

        img = np.asarray(sample_images((name,), include_sklearn=False)[name], dtype=np.float32)
        img = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
        _, h, w = img.shape
        corners = [(i, j) for i in range(0, h - size + 1, size) for j in range(0, w - size + 1, size)]
        tiles = [img[:, i : i + size, j : j + size] for i, j in corners]
        if not tiles:
            raise SystemExit(f"--size {size}: expected at most the {name} image's {h}x{w}")
        return np.ascontiguousarray(np.stack([tiles[k % len(tiles)] for k in range(samples)]))
    raise SystemExit(f"--sets: expected names from {','.join(SETS)}. Got {name!r}")


def _timed(passes: dict[str, list[float]], name: str, fn, *args) -> None:
    t0 = time.perf_counter()
    fn(*args)
    passes.setdefault(name, []).append(time.perf_counter() - t0)


def default_lookups() -> str:
    """How this CPU's vector decoder makes its table lookups by default."""
    return "gather instruction" if _ctxrans.set_gather() else "scalar loads"


def _decode_all(codec, bufs, shape, dtype, where, simd: bool = True, gather: bool | None = None) -> None:
    with decoder_settings(simd, gather):
        for b in bufs:
            codec.decode(b, shape, dtype, where)


class _TwoState:
    """A ctxrans codec writing the 2-state layout (mode 0) whatever the array's size."""

    def __init__(self, codec):
        self.codec = codec

    def encode(self, q):
        return _ctxrans.encode(self.codec._blob, q, q.shape, q.itemsize, 0)

    def decode(self, buf, shape, dtype):
        return self.codec.decode(buf, shape, dtype)


def packed_coefficients(name: str, x: np.ndarray, target_psnr: float, workdir: str, quant: str | None = None):
    """The set packed by the product under workdir/name (calibration, quantization, its lossless stage) and
    read back: (dataset, its dct field, the stored coefficients (N, C, Hb, K, Wb))."""
    src, out = os.path.join(workdir, f"{name}.npy"), os.path.join(workdir, name)
    np.save(src, x)
    dctdata.pack(src, out, target_psnr=target_psnr, quiet=True, **({"quant": quant} if quant else {}))
    ds = dctdata.open_dataset(out)
    field = next(f for f in ds.manifest.fields if f.codec is not None)
    return ds, field, ds.reader.read(field, 0, ds.manifest.samples)


def measure_set(
    name: str, x: np.ndarray, target_psnr: float, repeat: int, workdir: str, quant: str | None = None
) -> list[dict[str, Any]]:
    """Rows of one set: one per coder and the pack reader's."""
    ds, field, q = packed_coefficients(name, x, target_psnr, workdir, quant)
    n = ds.manifest.samples
    shape = (1, *q.shape[1:])
    lossless = field.lossless
    entropy = isinstance(get_stage(lossless), CtxransStage)
    stage = "ctxrans" if entropy else f"{lossless.get('id')}-{lossless.get('level')}"
    ctx = get_stage(lossless).codec if entropy else CtxCodec.fit(q, field.codec.cf, field.codec.mask)
    one, two = CtxransStage(ctx.get_config(), ctx), CtxransStage(ctx.get_config(), _TwoState(ctx))
    codecs = {
        "ctxrans": one,
        "ctxrans, gather instruction": one,
        "ctxrans, scalar loads": one,
        "ctxrans no AVX2": one,
        "ctxrans 2-state": two,
        "ctxrans 2-state no AVX2": two,
        "zstd-9": get_stage(DEFAULT_CODEC),
        "zstd-19": get_stage(ZSTD_MAX),
    }
    streams = {
        c: [bytes(codec.encode(np.ascontiguousarray(q[i : i + 1]))) for i in range(n)] for c, codec in codecs.items()
    }
    for c, codec in codecs.items():  # every coder gives the coefficients back
        for i, buf in enumerate(streams[c]):
            if not np.array_equal(codec.decode(buf, shape, q.dtype, f"{name} {c}"), q[i : i + 1]):
                raise RuntimeError(f"{name}: {c} did not decode sample {i} to its coefficients")
    passes: dict[str, list[float]] = {}  # seconds of each pass, per coder
    batches = [range(a, min(a + READER_BATCH, n)) for a in range(0, n, READER_BATCH)]
    for _ in range(repeat):
        for c, codec in codecs.items():
            settings = KERNEL_SETTINGS.get(c, (True, None))
            _timed(passes, c, _decode_all, codec, streams[c], shape, q.dtype, name, *settings)
        _timed(passes, "pack reader", lambda: [ds.reader.read_samples((field,), b) for b in batches])
    seconds = {c: min(t) for c, t in passes.items()}
    gather = passes["ctxrans, gather instruction"]
    floats = n * int(np.prod(field.shape)) * 4
    symbols = n * int(np.prod(shape))
    rows = []
    if stage not in streams:
        raise RuntimeError(f"{name}: the pack chose {stage}, expected one of {CODERS}")
    for c in (*CODERS, "pack reader"):
        stored = sum(map(len, streams[c if c in streams else stage])) / n  # the reader reads the pack's stage
        rows.append(
            {
                "set": name,
                "coder": c if c != "pack reader" else f"pack reader ({stage})",
                "pack_stage": stage,
                "samples": n,
                "sample_shape": list(field.shape),
                "coefficients": list(shape[1:]),
                "dtype": str(q.dtype),
                "bytes_per_sample": stored,
                "seconds": seconds[c],
                # paired: the median over passes of the gather instruction's time over this coder's in the
                # same pass (steadier than a ratio of bests on a shared machine)
                "vs_gather": float(np.median([g / t for g, t in zip(gather, passes[c])])),
                "mb_s": floats / seconds[c] / 1e6,
                "msym_s": symbols / seconds[c] / 1e6,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| set | dtype | coder | stored B/sample | ratio to float32 | decode MB/s (float32, 1 core) | M symbols/s "
        "| speed vs gather instruction (median of passes) |"
    )
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        ratio = int(np.prod(r["sample_shape"])) * 4 / r["bytes_per_sample"]
        lines.append(
            f"| {r['set']} | {r['dtype']} | {r['coder']} | {r['bytes_per_sample']:.0f} | {ratio:.1f} | "
            f"{r['mb_s']:.0f} | {r['msym_s']:.1f} | {r['vs_gather']:.2f} |"
        )
    return "\n".join(lines)


def add_set_arguments(p: argparse.ArgumentParser, sets: tuple[str, ...]) -> None:
    """The options of the scripts that measure coders on these sets (this one, zstd_levels.py)."""
    p.add_argument("--sets", default=",".join(sets))
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None)


def check_set_arguments(a: argparse.Namespace) -> None:
    if a.samples < 1 or a.size < 8 or a.repeat < 1:
        raise SystemExit("--samples, --repeat: expected >= 1, --size >= 8")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks entropy-decode-speed", description=__doc__.split("\n\n")[0])
    add_set_arguments(p, SETS)
    p.add_argument("--quant", default="", help="int8 or int16; unset: calibration chooses, as pack does")
    a = p.parse_args(argv)
    check_set_arguments(a)
    # per core: the reader would otherwise decode a batch's chunks on torch's threads (as a DataLoader
    # worker does not: it has one)
    os.environ["DCTDATA_READ_THREADS"] = "1"

    def measure(name: str, x: np.ndarray, workdir: str) -> list[dict[str, Any]]:
        return measure_set(name, x, a.target_psnr, a.repeat, workdir, a.quant or None)

    def lookups(payload: dict[str, Any]) -> list[str]:
        payload["default_lookups"] = default_lookups()
        return [f"this CPU's default lookups (the ctxrans row): {payload['default_lookups']}"]

    return run_sets(a, measure, table, lookups)


def run_sets(a: argparse.Namespace, measure, to_table, notes=lambda payload: []) -> dict[str, Any]:
    """Rows of `measure(name, samples, workdir)` for each set of `--sets`, then the table, the load average,
    `notes(payload)`'s lines and the JSON (`--json`); returns the payload."""
    load = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in [s for s in a.sets.split(",") if s]:
            rows += measure(name, load_set(name, a.samples, a.size), workdir)
    payload = {"rows": rows, "loadavg_before": list(load), "loadavg_after": list(os.getloadavg()), "argv": sys.argv}
    print(to_table(rows))
    after = payload["loadavg_after"][0]
    print(f"\nload average before {load[0]:.2f}, after {after:.2f} (one thread; shared machines vary)")
    for line in notes(payload):
        print(line)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(payload, fh, indent=1)
    return payload


if __name__ == "__main__":
    main()
