"""`dctdata inspect OUT`: a PNG with original | reconstruction | error | radial power spectrum for a few
samples of a packed dataset's `dct` field (`dctdata.preprocess.inspect`)."""

from __future__ import annotations

import os


def register(sub) -> None:
    p = sub.add_parser("inspect", help="PNG: original vs reconstruction vs error (+ spectrum) for a few samples")
    p.add_argument("out", metavar="OUT", help="packed dataset (directory or URL with manifest.json)")
    p.add_argument("--field", default=None, help="dct field to show (default: the only dct field)")
    p.add_argument(
        "--samples",
        type=int,
        default=3,
        help="how many samples: the worst (lowest PSNR) of up to --scan samples when the originals are at hand, "
        "else evenly spaced ones",
    )
    p.add_argument("--scan", type=int, default=256, help="samples searched for the worst ones (default 256)")
    p.add_argument("--channel", type=int, default=None, help="show only this channel (default: every channel)")
    p.add_argument("--channels", type=int, default=None, help="show the first N channels (default: every channel)")
    p.add_argument(
        "--original",
        default=None,
        metavar="SOURCE",
        help="read originals from this source (path, URL or module:callable) instead of the manifest's; a recorded "
        "module:callable is only run when named here",
    )
    p.add_argument(
        "--png", default=None, help="output PNG (default: ./<OUT name>-inspect.png; the pack is never written to)"
    )
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.preprocess.inspect import inspect_dataset

    png = args.png
    if png is None:  # in the current directory: a pack is read-only data (and may be a URL)
        from dctdata.format.location import manifest_location

        name = os.path.basename(manifest_location(args.out)[0].rstrip("/"))
        png = f"{name if name not in ('', '.', '..') else 'pack'}-inspect.png"
    path, shown = inspect_dataset(
        args.out, png, args.field, args.samples, args.channels, args.original, channel=args.channel, scan=args.scan
    )
    print(f"wrote {path}")
    if not shown:
        print(
            "originals not available (source missing or not matching; pass --original): reconstruction and spectrum "
            "only"
        )
    return 0
