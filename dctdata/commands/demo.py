"""`dctdata demo`: the README's first command. Synthetic EM pairs -> pack (zarr and webdataset) ->
DataLoader -> `Decompress` as the first layer of a small denoiser -> train, against the same
denoiser on the raw float32 arrays; prints one table (see `dctdata.demo`)."""

from __future__ import annotations

import sys

# `dctdata --help` lists the command from these alone (`dctdata.cli`): the demo's module imports torch
NAME = "demo"
HELP = "end to end on a synthetic EM denoising set: pack, stream, Decompress as first layer, train vs raw"


def register(sub) -> None:
    from dctdata.demo.pipeline import DemoSettings

    d = DemoSettings()
    p = sub.add_parser(
        NAME,
        help=HELP,
        description="Generate a small em_denoise-like set, pack it (zarr and webdataset), train a small denoiser whose "
        "first layer is Decompress on it and the same denoiser on the raw float32 arrays, and print one table.",
    )
    p.add_argument(
        "--out", metavar="DIR", help="keep the source, both packs and results.md/json here (a new or empty directory)"
    )
    p.add_argument("--n", type=int, default=d.n, help=f"training pairs to generate and pack (default {d.n})")
    p.add_argument("--test", type=int, default=d.test, help=f"held-out raw pairs for the test MSE (default {d.test})")
    p.add_argument("--size", type=int, default=d.size, help=f"image side, multiple of 8 (default {d.size})")
    p.add_argument("--crop", type=int, default=d.crop, help=f"training crop side, multiple of 8 (default {d.crop})")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"training epochs per network (default {d.epochs})")
    p.add_argument(
        "--batch-size", type=int, default=d.batch_size, help=f"DataLoader batch size (default {d.batch_size})"
    )
    p.add_argument(
        "--target-psnr", type=float, default=d.target_psnr, help=f"pack target PSNR in dB (default {d.target_psnr:g})"
    )
    p.add_argument(
        "--quant", default=d.quant, choices=["int8", "int16"], help=f"coefficient wire dtype (default {d.quant})"
    )
    p.add_argument("--width", type=int, default=d.width, help=f"denoiser channels (default {d.width})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--threads",
        type=int,
        default=d.threads,
        help=f"torch and Blosc threads for the run (default {d.threads}: its tensors are small, and more threads "
        "than free cores slow it down)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.demo import DemoSettings, format_table, run_demo, table_notes

    s = DemoSettings(
        n=args.n,
        test=args.test,
        size=args.size,
        crop=args.crop,
        epochs=args.epochs,
        batch_size=args.batch_size,
        target_psnr=args.target_psnr,
        quant=args.quant,
        width=args.width,
        seed=args.seed,
        threads=args.threads,
    )
    result = run_demo(s, out=args.out, quiet=args.quiet)
    rows = result["rows"]
    packed = {r["data"]: r for r in rows[1:]}
    settings = next(iter(packed.values()))["settings"]
    print(
        f"dctdata demo: {s.n} em_denoise-like training pairs (noisy, clean) of 1x{s.size}x{s.size} float32, "
        f"packed with --target-psnr {s.target_psnr:g} --quant {s.quant} ("
        + ", ".join(f"{k}: {v}" for k, v in settings.items())
        + f"); denoiser trained {s.epochs} epochs on {s.crop}x{s.crop} crops, batch {s.batch_size}, CPU threads "
        f"{s.threads}"
    )
    print()
    print(format_table(rows))
    print()
    for line in table_notes(result):
        print(line)
    where = f"artifacts kept in {result['work']}" if args.out else "artifacts removed (use --out DIR to keep them)"
    print(f"wall time {result['seconds']:.1f} s; {where}", file=sys.stdout)
    return 0
