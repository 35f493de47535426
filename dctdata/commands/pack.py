"""`dctdata pack SOURCE OUT`: pack a source into a dctdata dataset (zarr or webdataset)."""

from __future__ import annotations

import argparse

from dctdata.spec import QUANT_TO_DTYPE


def register(sub) -> None:
    p = sub.add_parser(
        "pack",
        help="pack .npy/.npz/HDF5/NetCDF/zarr stores/image folders/module:callable datasets into a dctdata dataset",
    )
    p.add_argument(
        "source",
        metavar="SOURCE",
        help=".npy, .npz, HDF5, NetCDF (.nc), a zarr store (path or URL), a directory (per-sample .npy/.npz or "
        "images), or module:callable",
    )
    p.add_argument(
        "out",
        metavar="OUT",
        help="output directory or fsspec URL prefix (s3://bucket/x; must not hold a dataset unless --overwrite)",
    )
    p.add_argument("--format", default="zarr", help="zarr (random access, default) or webdataset (streaming shards)")
    p.add_argument("--cf", type=int, default=None, help="chop factor 1..8 (default 4 without --target-psnr)")
    p.add_argument("--mask", default=None, choices=["square", "triangle"], help="kept-frequency mask (default square)")
    p.add_argument(
        "--quant", default=None, choices=list(QUANT_TO_DTYPE), help="coefficient dtype (default none = fp32)"
    )
    p.add_argument(
        "--target-psnr",
        default=None,
        metavar="DB|NAME=DB,...",
        help="calibrate steps (and free knobs) to reach this PSNR (per channel, over valid pixels); per field: "
        "noisy=40,clean=45 (a bare DB sets the fields not named)",
    )
    p.add_argument(
        "--field", action="append", default=[], metavar="NAME=KIND", help="override a field's kind (dct|array|label)"
    )
    p.add_argument("--key", action="append", default=None, help="HDF5 dataset(s) to pack (repeat or comma-separate)")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-sample arrays are (H, W, C): move C first (--no-channels-last: keep a layout that looks "
        "channels-last as it is)",
    )
    p.add_argument(
        "--nan",
        default="error",
        metavar="error|mask|fill=VALUE",
        help="NaN/Inf in dct fields: error (default); mask: fill smoothly and store the validity mask as "
        "FIELD_valid; fill=VALUE: a constant, no mask",
    )
    p.add_argument(
        "--valid",
        action="append",
        default=None,
        metavar="FIELD=MASKFIELD",
        help="the source field MASKFIELD (nonzero = valid) is FIELD's validity mask (repeat for more fields)",
    )
    p.add_argument(
        "--sample-dim", default=None, metavar="DIM", help="NetCDF/zarr: the dimension that becomes samples (e.g. time)"
    )
    p.add_argument(
        "--variables", default=None, metavar="A,B,...", help="NetCDF/zarr: data variables to pack (default: all)"
    )
    p.add_argument(
        "--stack",
        default=None,
        metavar="NAME",
        help="NetCDF/zarr: stack the variables as the channels of one field NAME (default: a field each)",
    )
    p.add_argument(
        "--lossless",
        default="auto",
        metavar="auto|zstd|zstd:LEVEL",
        help="lossless stage: auto (default: per dct field the smaller of the entropy coder and zstd-19), zstd "
        "(zstd-19, the read-speed choice: more bytes, decoded several times faster in the loader workers), "
        "zstd:LEVEL (1..22)",
    )
    p.add_argument("--strict", action="store_true", help="fail on any quantization overflow")
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing OUT (only once the new one is complete)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="pack on a local Dask cluster of N processes (needs dctdata[dask])",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="pack on an existing Dask cluster (tcp://host:8786); workers must see SOURCE and OUT",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted pack of the same settings (redo only unfinished parts)",
    )
    p.add_argument(
        "--max-shard-size",
        default=None,
        metavar="SIZE",
        help="webdataset: cap on each .tar shard, in bytes or with a unit: 64MiB, '1.5 GB' (default 256 MiB)",
    )
    p.add_argument(
        "--samples-per-shard",
        type=int,
        default=None,
        metavar="N",
        help="webdataset: samples per shard (default: as many as fit the cap, and at least 16 shards for a set of "
        "16 samples or more, so ranks x DataLoader workers each get whole shards)",
    )
    p.set_defaults(func=_main)


def _writer_options(args) -> dict:
    """Shard caps go to the webdataset writer; refused for other formats rather than ignored."""
    from dctdata.errors import DctDataError
    from dctdata.parse import parse_size

    size = None if args.max_shard_size is None else parse_size(args.max_shard_size, "--max-shard-size")
    opts = {k: v for k, v in (("max_shard_size", size), ("samples_per_shard", args.samples_per_shard)) if v is not None}
    if opts and args.format != "webdataset":
        raise DctDataError(
            f"--max-shard-size/--samples-per-shard: expected --format webdataset. Got --format {args.format}"
        )
    return opts


def _main(args) -> int:
    from dctdata.api import pack
    from dctdata.format.fields import user_fields
    from dctdata.lossless import parse_lossless_option
    from dctdata.report import num, pack_summary

    manifest = pack(
        args.source,
        args.out,
        format=args.format,
        cf=args.cf,
        mask=args.mask,
        quant=args.quant,
        target_psnr=args.target_psnr,
        fields=args.field,
        key=args.key,
        channels_last=args.channels_last,
        nan=args.nan,
        valid=args.valid,
        sample_dim=args.sample_dim,
        variables=args.variables,
        stack=args.stack,
        codec=parse_lossless_option(args.lossless),
        strict=args.strict,
        overwrite=args.overwrite,
        quiet=args.quiet,
        workers=args.workers,
        scheduler=args.scheduler,
        resume=args.resume,
        writer_options=_writer_options(args),
    )
    if not args.quiet:
        shards = manifest.layout.get("shards") if manifest.storage == "webdataset" else None
        files = f"{len(shards)} shards" if isinstance(shards, list) else f"{len(manifest.checksums)} files"
        t = pack_summary(manifest)
        print(
            f"packed {manifest.samples} samples into {args.out} ({manifest.storage}, {files}): stored "
            f"{t['stored_bytes'] / 1e6:.3f} MB, ratio {num(t['ratio_f32'])}x vs float32 and {num(t['ratio_src'])}x vs "
            f"the source, transfer ratio {num(t['transfer'])}x (float32 bytes / bytes sent to the device)"
        )
        for f in user_fields(manifest.fields):
            s = manifest.stats[f.name]
            extra = ""
            if f.is_dct:
                c = f.codec
                valid = f", {100 * s.valid_fraction:.1f}% valid pixels" if s.valid_fraction is not None else ""
                stage = (f.lossless or {}).get("id", "raw")
                extra = (
                    f" cf={c.cf} {c.mask} {c.dtype} {stage}: PSNR min {num(s.psnr_min)} / median "
                    f"{num(s.psnr_median)} / dataset {num(s.psnr_dataset)} dB, max error {s.max_abs_error:.4g}, "
                    f"overflow {s.overflow}{valid}"
                )
            print(f"  {f.name}: {f.kind} {list(f.shape)} {f.dtype}{extra}")
            names = f.attrs.get("channels") if isinstance(f.attrs.get("channels"), list) else []
            label = lambda i, names=names: f" ({names[i]})" if i < len(names) else ""  # noqa: E731
            for i, ch in enumerate((s.channels or ()) if len(s.channels or ()) > 1 else ()):
                print(
                    f"    channel {i}{label(i)}: PSNR min {num(ch.psnr_min)} / median {num(ch.psnr_median)} / dataset "
                    f"{num(ch.psnr_dataset)} dB, max error {num(ch.max_abs_error, '{:.4g}')}"
                )
    return 0
