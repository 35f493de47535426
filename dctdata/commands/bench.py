"""`dctdata bench KIND`: throughput and rate-distortion tables (`dctdata.bench`, imported only when a
benchmark runs)."""

from __future__ import annotations

import argparse
import warnings


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="throughput and rate-distortion benchmarks",
        description="Throughput and rate-distortion benchmarks.",
    )
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND", required=True)

    c = _kind(
        kinds,
        "codec",
        "decode throughput vs memory copy and the paper's dense formulation",
        "Single-image decode time of Decompress against a copy of its output and the paper's dense matmuls.",
    )
    c.add_argument("--sizes", type=int, nargs="+", default=[256, 1024], help="square image sides")
    c.add_argument("--cf", type=int, nargs="+", default=[2, 4, 6, 8], help="chop factors")
    c.add_argument("--paper-sizes", type=int, nargs="+", default=[512, 1024], help="sides for the paper's baseline")
    c.add_argument("--repeat", type=int, default=10, help="timing repeats (best is kept)")
    c.add_argument(
        "--threads", type=int, nargs="+", default=None, help="torch intra-op thread counts (default: 1 and all cores)"
    )
    c.set_defaults(func=_codec)

    r = _kind(
        kinds,
        "rd",
        "rate-distortion and speed table: dctdata settings vs ZFP and JPEG",
        "Stored ratio, PSNR and speed of dctdata settings against ZFP and JPEG on a data source.",
    )
    r.add_argument("source", metavar="SOURCE", help="'samples', 'fields' or a .npy file (N, [C,] H, W)")
    r.add_argument(
        "--targets", type=float, nargs="+", default=[30.0, 40.0, 50.0], help="--target-psnr settings to show"
    )
    r.add_argument("--paper-cf", type=int, nargs="+", default=[2, 3, 4], help="fp32 DCT+Chop chop factors")
    r.add_argument("--ratio", type=float, default=16.0, help="also show dctdata calibrated to this stored ratio")
    r.add_argument("--count", type=int, default=16, help="samples per field kind ('fields') or read from a .npy")
    r.add_argument("--size", type=int, default=256, help="field size for 'fields'")
    r.add_argument("--calib", type=int, default=8, help="calibration subset size per dataset")
    r.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    r.add_argument("--plot", metavar="PNG", help="also draw PSNR vs stored ratio to this PNG")
    r.set_defaults(func=_rd)

    what = "DataLoader samples/s of a dctdata zarr pack against raw float32 zarr and PNG/JPEG decoded by torchvision."
    lo = _kind(kinds, "loader", "DataLoader samples/s: dctdata zarr vs raw float32 zarr vs PNG/JPEG", what)
    _pipeline_options(lo)
    lo.set_defaults(func=_loader)

    what = "Samples/s streaming webdataset shards from disk and loopback HTTP, against zarr and raw float32 shards."
    s = _kind(kinds, "stream", "samples/s streaming webdataset shards vs zarr and raw float32 shards", what)
    _pipeline_options(s)
    s.add_argument("--samples-per-shard", type=int, default=64, help="webdataset samples per shard")
    s.add_argument("--quant", default="int8", help="coefficient dtype")
    s.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the main process")
    s.set_defaults(func=_stream)


def _kind(kinds, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """One benchmark's parser; --help shows every default."""
    return kinds.add_parser(
        name, help=help, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )


def _pipeline_options(p: argparse.ArgumentParser) -> None:
    """The data and DataLoader flags the loader benchmarks share."""
    p.add_argument("--samples", type=int, default=512, help="samples generated and packed")
    p.add_argument("--size", type=int, default=256, help="image side")
    p.add_argument("--target-psnr", type=float, default=40.0, help="pack target PSNR in dB")
    p.add_argument("--batch", type=int, default=32, help="DataLoader batch size")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--epochs", type=int, default=2, help="epochs timed (best is kept)")


def _codec(args) -> int:
    import torch

    from dctdata.bench.codec import format_rows, run_codec_bench
    from dctdata.loaders.threads import available_cores

    threads = args.threads or sorted({1, available_cores()})
    rows = run_codec_bench(args.sizes, args.cf, args.paper_sizes, repeat=args.repeat, threads=threads)
    print(
        f"torch {torch.__version__}, threads {', '.join(map(str, threads))}, float32 output, best of {args.repeat} "
        "(outputs of at least 64 MB: best of a third as many); x copy: decode time over the time to copy the same "
        "output bytes into a preallocated buffer"
    )
    print(format_rows(rows))
    return 0


def _rd(args) -> int:
    import torch

    from dctdata.bench.rd import format_rows, load_source, plot_rd, run_rd
    from dctdata.lossless import DEFAULT_CODEC

    datasets = load_source(args.source, n=args.count, size=args.size)
    rows, lines = run_rd(
        datasets,
        targets=tuple(args.targets),
        paper_cfs=tuple(args.paper_cf),
        calib=args.calib,
        ratio=args.ratio,
        threads=args.threads,
    )
    items = sum(d.x.shape[0] * d.x.shape[1] for d in datasets)
    print(
        f"{args.source}: {len(datasets)} dataset(s), {sum(len(d.x) for d in datasets)} samples, {items} items; "
        f"lossless stage {DEFAULT_CODEC}; torch {torch.__version__}, {args.threads} thread(s)"
    )
    print(format_rows(rows))
    for line in lines:
        print("- " + line)
    if args.plot:
        plot_rd(rows, args.plot, title=args.source)
        print(f"plot: {args.plot}")
    return 0


def _loader(args) -> int:
    from dctdata.bench.loader import format_rows, run_loader_bench

    rows = run_loader_bench(args.samples, args.size, args.target_psnr, args.batch, args.workers, args.epochs)
    print(
        f"{args.samples} samples of 1x{args.size}x{args.size} (8-bit range), DataLoader(num_workers={args.workers}, "
        f"batch_size={args.batch}, shuffle) to float32 model input; best of {args.epochs} epochs; torch threads=1 in "
        "main"
    )
    print(format_rows(rows))
    return 0


def _stream(args) -> int:
    import torch

    from dctdata.bench.stream import format_rows, run_stream_bench

    warnings.filterwarnings("ignore", message=".*worker processes in total.*")
    rows, meta = run_stream_bench(
        args.samples,
        args.size,
        args.samples_per_shard,
        args.workers,
        args.batch,
        args.epochs,
        args.quant,
        args.target_psnr,
        args.threads,
    )
    c = meta["codec"]
    print(
        f"torch {torch.__version__}; {meta['n']} samples of 1x{meta['size']}x{meta['size']} float32; cf={c.cf} "
        f"{c.mask} {c.dtype}; "
        f"{meta['shards']} shards; DataLoader(num_workers={args.workers}, batch_size={args.batch}, persistent_workers) "
        "-> Decompress "
        f"in the main process ({args.threads} thread); best of {args.epochs} epochs; sha256 {meta['sha_GBps']:.2f} GB/s"
    )
    print(format_rows(rows))
    return 0
