"""`dctdata pack SOURCE OUT`: pack a source into a dctdata dataset (zarr or webdataset). The options are
`dctdata.settings.PackSettings`' fields (flag, help and default from each field's metadata)."""

from __future__ import annotations

# `dctdata --help` lists the command from these alone (`dctdata.cli`): its settings import torch
NAME = "pack"
HELP = "pack .npy/.npz/HDF5/NetCDF/zarr stores/image folders/module:callable datasets into a dctdata dataset"
STARTING = "pack: starting (loading torch)"  # shown on a terminal while the packer's modules load


def register(sub) -> None:
    from dctdata.settings import PackSettings

    p = sub.add_parser(NAME, help=HELP)
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
    PackSettings.add_arguments(p)  # every setting's flag, help and default, from its field
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.api import pack
    from dctdata.format import storages
    from dctdata.format.fields import user_fields
    from dctdata.report import fidelity_line, num, pack_summary, time_lines, volume_hint
    from dctdata.settings import PackSettings

    manifest = pack(args.source, args.out, settings=PackSettings.from_args(args))
    if not args.quiet:
        files = storages.get(manifest.storage).describe_files(manifest)
        t = pack_summary(manifest)
        print(
            f"packed {manifest.samples} samples into {args.out} ({manifest.storage}, {files}): stored "
            f"{t['stored_bytes'] / 1e6:.3f} MB (every file, the manifest included), ratio {num(t['ratio_f32'])}x vs "
            f"float32 and {num(t['ratio_src'])}x vs the source, transfer ratio {num(t['transfer'])}x (float32 bytes / "
            "bytes sent to the device)"
        )
        promise = fidelity_line(manifest)
        if promise is not None:
            print(f"  {promise}")
        for f in user_fields(manifest.fields):
            s = manifest.stats[f.name]
            extra = f.kind_type.summary(f, s, num)  # a coded field's settings and figures
            why = f" ({f.reason})" if f.reason else ""  # why the field got its kind (issue 31)
            print(f"  {f.name}: {f.kind} {list(f.shape)} {f.dtype}{why}{extra}")
            names = f.attrs.get("channels") if isinstance(f.attrs.get("channels"), list) else []
            label = lambda i, names=names: f" ({names[i]})" if i < len(names) else ""  # noqa: E731
            for i, ch in enumerate((s.channels or ()) if len(s.channels or ()) > 1 else ()):
                print(
                    f"    channel {i}{label(i)}: PSNR min {num(ch.psnr_min)} / median {num(ch.psnr_median)} / dataset "
                    f"{num(ch.psnr_dataset)} dB, max error {num(ch.max_abs_error, '{:.4g}')}"
                )
        over_time = time_lines(manifest)  # a trajectory pack: per field, channel and step range
        if over_time:
            print("  fidelity over time (every frame; `dctdata info OUT --step-ranges A:B,C:D` chooses the ranges):")
            for line in over_time:
                print(f"    {line}")
        if args.dims is None:  # not said: offer volumes where a field looks like one
            for hint in filter(None, map(volume_hint, user_fields(manifest.fields))):
                print(f"  hint: {hint}")
    return 0
