r"""Bytes of the entropy stage's segments (stream mode 3) per segment length, on the synthetic fields and the
photos that ship with the packages: what a shorter segment (a shorter GPU decode chain) costs.

Each set is packed by the product (`dctdata.pack`, default settings at `--target-psnr`), then every sample is
encoded alone (one stream a sample, as the packs store them) by the field's fitted model, once per stream layout:
mode 2 (no segments: version 2), and mode 3 with each `--segment` length (coefficients per segment) under the
`--segment-bytes` bound (one segment beyond the first version 3 count per that many stream bytes; 0: none). The
table gives bytes a sample, the segments a sample (mean), and the change against SEGMENT_V3 = 16384 with the same
bound (with the default bound, what the packs of the first version 3 release store) and against mode 2.

    python -m benchmarks segment-cost                              # ~2 min on one core
    python -m benchmarks segment-cost --segment 16384 8192 4096 2048 --out segment_cost.json
    python -m benchmarks segment-cost --segment-bytes 0           # segments by coefficients alone
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Any

import numpy as np

import dctdata
from dctdata.entropy.ctxrans import MODE_SEGMENTS, SEGMENT, SEGMENT_BYTES, SEGMENT_V3, CtxCodec
from dctdata.stages import CtxransStage, get_stage


def tiles(images: dict[str, np.ndarray], size: int) -> np.ndarray:
    """Non-overlapping size x size tiles of uint8 photos of one channel count, float32 (N, C, size, size) 0..255."""
    out = []
    for img in images.values():
        x = np.asarray(img, np.float32)
        x = x[None] if x.ndim == 2 else x.transpose(2, 0, 1)
        _, h, w = x.shape
        corners = [(i, j) for i in range(0, h - size + 1, size) for j in range(0, w - size + 1, size)]
        out += [x[:, i : i + size, j : j + size] for i, j in corners]
    return np.stack(out)


def sets(n: int, size: int) -> dict[str, np.ndarray]:
    """name -> float32 (N, C, size, size): the em stand-in the GPU benchmarks use, the three synthetic SciML fields,
    and 256x256 tiles of the shipped grey and RGB photos."""
    from sci_fields import synthetic_fields
    from shipped_images import sample_images

    from benchmarks.loader import synthetic

    out = {"em": synthetic(n, size)}
    out.update(synthetic_fields(n=n, size=size))
    photos = sample_images()
    grey = {k: v for k, v in photos.items() if v.ndim == 2}
    rgb = {k: v for k, v in photos.items() if v.ndim == 3}
    out[f"photos grey ({', '.join(grey)})"] = tiles(grey, size)
    out[f"photos RGB ({', '.join(rgb)})"] = tiles(rgb, size)
    return out


def packed(x: np.ndarray, target_psnr: float, workdir: str) -> tuple[CtxCodec, np.ndarray]:
    """(the entropy codec the pack fitted, or one fitted alike if the pack chose zstd; its coefficients)."""
    src = os.path.join(workdir, "x.npy")
    np.save(src, x)
    out = os.path.join(workdir, "pack")
    dctdata.pack(src, out, target_psnr=target_psnr, quiet=True, overwrite=True)
    ds = dctdata.open_dataset(out)
    field = next(f for f in ds.manifest.fields if f.codec is not None)
    q = np.ascontiguousarray(ds.reader.read(field, 0, ds.manifest.samples))
    stage = get_stage(field.lossless)
    if isinstance(stage, CtxransStage):
        return stage.codec, q
    return CtxCodec.fit(q, field.codec.cf, field.codec.mask), q


def segments_of(buf: bytes) -> int:
    """The segment count of a stream (1 outside mode 3)."""
    if buf[0] != MODE_SEGMENTS:
        return 1
    count, shift, p = 0, 0, 1
    while True:
        count |= (buf[p] & 0x7F) << shift
        shift, p = shift + 7, p + 1
        if not buf[p - 1] & 0x80:
            return count


def measure(codec: CtxCodec, q: np.ndarray, segments: list[int], segment_bytes: int) -> dict[str, Any]:
    """Bytes a sample in mode 2 and with each segment length (every sample encoded alone, `segment_bytes` the
    bound), and the segments a sample (mean)."""

    def streams(c: CtxCodec) -> list[bytes]:
        return [c.encode(q[i : i + 1]) for i in range(len(q))]

    mode2 = streams(codec.with_streams(version=2))
    row: dict[str, Any] = {"mode2": sum(map(len, mode2)) / len(q), "segments": {}}
    for s in segments:
        bufs = streams(codec.with_streams(version=3, segment=s, segment_bytes=segment_bytes))
        row["segments"][str(s)] = {
            "bytes": sum(map(len, bufs)) / len(q),
            "per_sample": sum(map(segments_of, bufs)) / len(q),
        }
    return row


def table(result: dict[str, Any]) -> str:
    segs = [str(s) for s in result["segment"]]
    ref = str(SEGMENT_V3)
    head = "| set | sample | dtype | mode 2 B/sample | " + " | ".join(f"segment {s}" for s in segs) + " |"
    lines = [head, "|---|---|---|---:|" + "---:|" * len(segs)]
    for name, r in result["sets"].items():
        cells = []
        for s in segs:
            seg = r["segments"][s]
            vs_ref = f", {100 * (seg['bytes'] / r['segments'][ref]['bytes'] - 1):+.2f}% vs {ref}" if ref in segs else ""
            cells.append(f"{seg['bytes']:.0f} ({seg['per_sample']:g} seg, {100 * (seg['bytes'] / r['mode2'] - 1):+.2f}%"
                         f" vs mode 2{vs_ref})")  # fmt: skip
        lines.append(f"| {name} | {r['shape']} | {r['dtype']} | {r['mode2']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks segment-cost",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--samples", type=int, default=16, help="samples of each synthetic set (default 16)")
    p.add_argument("--size", type=int, default=256, help="sample height and width (default 256)")
    p.add_argument("--target-psnr", type=float, default=40.0)
    p.add_argument(
        "--segment", type=int, nargs="+", default=[SEGMENT_V3, SEGMENT, SEGMENT // 2],
        help=f"coefficients per segment (default {SEGMENT_V3} {SEGMENT} {SEGMENT // 2})",
    )  # fmt: skip
    p.add_argument(
        "--segment-bytes", type=int, default=SEGMENT_BYTES,
        help=f"stream bytes per segment beyond the first version 3 count (default {SEGMENT_BYTES}; 0: no bound)",
    )  # fmt: skip
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    result: dict[str, Any] = {"args": vars(a), "segment": a.segment, "sets": {}}
    for name, x in sets(a.samples, a.size).items():
        with tempfile.TemporaryDirectory() as tmp:
            codec, q = packed(x, a.target_psnr, tmp)
        row = measure(codec, q, a.segment, a.segment_bytes)
        row.update(shape=f"{len(q)} x {tuple(q.shape[1:])}", dtype=str(q.dtype))
        result["sets"][name] = row
    print(table(result))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
