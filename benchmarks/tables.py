"""`python -m benchmarks codec|rd|loader|stream|gpu`: the throughput and rate-distortion tables (each
table's module is imported only when it runs, except the rd bench's light option defaults)."""

from __future__ import annotations

import argparse

from dctdata.errors import DctDataError


def register(sub) -> None:
    """Add the five tables to `sub` (the subcommands of `python -m benchmarks`)."""
    from benchmarks.items import ITEMS, MAX_TILES, MODES
    from benchmarks.ours import TARGETS
    from benchmarks.peers import PEERS
    from benchmarks.rd import LEVELS

    kinds = sub
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
        "compression ratio at equal PSNR: dctdata vs ZFP, SZ3, SPERR, JPEG 2000 and JPEG",
        "Compression ratio at equal dataset PSNR of real dctdata packs against ZFP, SZ3, SPERR, JPEG 2000 and JPEG, "
        "on arrays shipped with scikit-image, scikit-learn, matplotlib and nibabel plus synthetic SciML stand-ins, cut "
        "into 60x76 tiles and whole. Prints markdown tables.",
    )
    r.add_argument("--items", nargs="+", default=list(ITEMS), metavar="NAME", help="items to use")
    r.add_argument("--modes", nargs="+", default=list(MODES), metavar="MODE", help="packs per item: tiles, whole")
    r.add_argument("--peers", nargs="*", default=list(PEERS), metavar="PEER", help="peer codecs (none: dctdata only)")
    r.add_argument(
        "--targets", type=float, nargs="+", default=list(TARGETS), metavar="DB", help="dctdata --target-psnr sweep"
    )
    r.add_argument("--levels", type=float, nargs="+", default=list(LEVELS), metavar="DB", help="equal-PSNR levels")
    r.add_argument("--max-tiles", type=int, default=MAX_TILES, help="tiles per item at most (evenly spaced)")
    r.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    r.add_argument("--per-pack", action="store_true", help="also print every pack's compression ratios")
    r.add_argument("--json", metavar="OUT", help="write every point and the summary to this JSON file")
    r.set_defaults(func=_rd)

    what = "DataLoader samples/s of a dctdata zarr pack against raw float32 zarr and PNG/JPEG decoded by torchvision."
    lo = _kind(kinds, "loader", "DataLoader samples/s: dctdata zarr vs raw float32 zarr vs PNG/JPEG", what)
    _pipeline_options(lo)
    lo.set_defaults(func=_loader)

    what = (
        "DataLoader samples/s of dctdata webdataset and zarr packs against raw float32 peers (webdataset, tensorstore, "
        "zarr-python, LitData, MosaicML Streaming), locally and over a bandwidth-throttled loopback HTTP server."
    )
    s = _kind(kinds, "stream", "samples/s of dctdata packs vs raw float32 peers, local and throttled HTTP", what)
    _pipeline_options(s)
    s.add_argument("--samples-per-shard", type=int, default=64, help="webdataset samples per shard")
    s.add_argument("--quant", default="int8", help="coefficient dtype")
    s.add_argument("--rate-mbps", type=float, default=25.0, help="HTTP server bandwidth cap in MB/s (0: unthrottled)")
    s.add_argument("--only", nargs="+", metavar="TEXT", help="peers whose name contains TEXT (dctdata rows always run)")
    s.add_argument("--no-decode", action="store_true", help="skip the '+ Decompress' rows (two thread settings)")
    s.set_defaults(func=_stream)

    _register_gpu(kinds)


def _register_gpu(kinds) -> None:
    what = (
        "Decompress GB/s on a CUDA device (CF x size x float32/bfloat16), and loader -> DevicePrefetcher -> model "
        'input samples/s for every --workers and --batch: the default and --lossless zstd packs with decode="cpu" '
        'and decode="device" (ds.decompressor() decoding the stored bytes on the device), raw float32 host-to-device '
        "copies and torchvision decode_jpeg on the device at equal PSNR; bytes crossing per sample and the decode "
        "time per batch. Without CUDA it prints one line and exits 0."
    )
    g = _kind(kinds, "gpu", "Decompress and the loader path on a CUDA device (skips without one)", what)
    g.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[256, 512, 1024, 2048],
        help="square image sides (none: no decode table)",
    )
    g.add_argument("--cf", type=int, nargs="+", default=[2, 4, 6, 8], help="chop factors")
    g.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"], help="output dtypes"
    )
    g.add_argument("--repeat", type=int, default=20, help="timed calls per decode row (best is kept)")
    g.add_argument("--device", default="cuda", help="torch device (cpu runs the same tables, for a check)")
    g.add_argument("--samples", type=int, default=1024, help="distinct samples generated and packed")
    g.add_argument("--size", type=int, default=256, help="image side of the loader rows")
    g.add_argument("--target-psnr", type=float, default=40.0, help="pack target PSNR in dB")
    g.add_argument("--batch", type=int, nargs="+", default=[32, 256], help="DataLoader batch sizes")
    g.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="DataLoader worker counts")
    g.add_argument("--epochs", type=int, default=2, help="timed epochs after one untimed (best is kept)")
    g.add_argument(
        "--epoch-samples",
        type=int,
        default=4096,  # benchmarks.gpu.MIN_EPOCH_SAMPLES (not imported here: it loads torch)
        help="samples an epoch reads at least (and at least 4 batches a worker), cycling through --samples",
    )
    g.add_argument("--jobs", type=int, default=4, help="processes that generate and pack the data (1: in this one)")
    g.add_argument("--json", metavar="PATH", help="write every row, the device, date, command and must-show ratios")
    g.add_argument(
        "--decode-only", action="store_true", help="the Decompress table alone (no packs, no loader rows: seconds)"
    )
    g.set_defaults(func=_gpu)


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

    from benchmarks.codec import format_rows, run_codec_bench
    from dctdata.loaders.threads import available_cores

    threads = args.threads or sorted({1, available_cores()})
    rows = run_codec_bench(args.sizes, args.cf, args.paper_sizes, repeat=args.repeat, threads=threads)
    print(
        f"torch {torch.__version__}, threads {', '.join(map(str, threads))}, float32 output, best of {args.repeat} "
        "(outputs of at least 64 MB: best of a third as many); x copy: decode time over the time to copy the same "
        "output bytes into a preallocated buffer; out=: decode into a reused output buffer (Decompress(q, out=buf))"
    )
    print(format_rows(rows))
    return 0


def _rd(args) -> int:
    from benchmarks.rd import Config, report, timed_run

    config = Config(args.items, args.modes, args.peers, args.targets, args.levels, args.max_tiles, args.threads)
    results, notes, seconds = timed_run(config, args.json)
    print(report(config, results, notes, args.per_pack, seconds))
    if args.json:
        print(f"points: {args.json}")
    return 0


def _loader(args) -> int:
    from benchmarks.loader import format_batch_rows, format_rows, run_batch_bench, run_loader_bench

    batch_rows = run_batch_bench(args.samples, args.size, args.batch, args.target_psnr)
    print(
        f"read path: one batch of {args.batch} random samples of 1x{args.size}x{args.size} from {args.samples} stored "
        "(local, page cache), median of 20 batches, best of 3 rounds (the rows take turns, 5 batches at a time), at 1 "
        "thread and at all cores (torch threads for dctdata, default concurrency for tensorstore)"
    )
    print(format_batch_rows(batch_rows))
    print()
    rows = run_loader_bench(args.samples, args.size, args.target_psnr, args.batch, args.workers, args.epochs)
    print(
        f"{args.samples} samples of 1x{args.size}x{args.size} (8-bit range), DataLoader(num_workers={args.workers}, "
        f"batch_size={args.batch}, shuffle) to float32 model input; best of {args.epochs} epochs; torch threads=1 in "
        "main"
    )
    print(format_rows(rows))
    return 0


def _gpu(args) -> int:
    import datetime
    import os
    import shlex
    import tempfile
    import time

    import torch

    import dctdata
    from benchmarks import gpu

    reason = gpu.skip_reason(args.device)
    if reason:
        print(f"bench gpu: skipped: {reason}")
        return 0
    for name in ("samples", "size", "epochs", "epoch_samples", "jobs", *(["repeat"] if args.sizes else [])):
        if getattr(args, name) < 1:
            raise DctDataError(f"--{name.replace('_', '-')}: expected a positive int. Got {getattr(args, name)}")
    if min(args.workers) < 0 or min(args.batch) < 1 or max(args.batch) > args.samples:
        raise DctDataError(
            f"--batch/--workers: expected batches of 1..{args.samples} samples (--samples) and workers >= 0. Got "
            f"batches {args.batch}, workers {args.workers}"
        )
    t0 = time.perf_counter()
    dev = torch.device(args.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    argv = getattr(args, "argv", None)
    result = {
        "device": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": argv,
        "command": None if argv is None else f"python -m benchmarks {shlex.join(argv)}",
        "torch": torch.__version__,
        "dctdata": dctdata.__version__,
        "commit": _commit(),
        "cpus": os.cpu_count(),
        "timer": gpu.timer_name(dev),
        "settings": {k: v for k, v in vars(args).items() if k not in ("func", "argv", "name")},
        "complete": False,
        "seconds": {},
        "decode_rows": [],
        "pipeline_rows": [],
        "must_show": {},
    }

    def save(rows=None) -> None:
        if rows is not None:
            result["pipeline_rows"] = rows
            r = rows[-1]
            got = f"failed: {r['error']}" if r.get("error") else f"{r['samples_per_s']:.0f} samples/s"
            print(f"  {time.perf_counter() - t0:5.0f} s  workers={r['workers']} batch={r['batch']} {r['pipeline']}: "
                  f"{got}", flush=True)  # fmt: skip
        result["must_show"] = gpu.must_show(result["pipeline_rows"], result["decode_rows"])
        result["seconds"]["total"] = time.perf_counter() - t0
        if args.json:
            gpu.write_json(args.json, result)

    if args.decode_only:
        if not args.sizes:
            raise DctDataError("--decode-only: expected --sizes (the decode table's sizes). Got none")
        print(f"{name}; torch {torch.__version__}; Decompress, int8 coefficients in, batches of about 64 MB of output")
        result["decode_rows"] = gpu.decode_rows(args.device, args.sizes, args.cf, args.dtypes, args.repeat)
        print(gpu.format_decode_rows(result["decode_rows"]), flush=True)
        result["complete"] = True
        save()
        print(gpu.format_must_show(result["must_show"]))
        return 0
    with tempfile.TemporaryDirectory(prefix="dctdata-bench-gpu-") as tmp:
        setup = gpu.Setup(tmp, args.samples, args.size, args.target_psnr, jobs=args.jobs).start()  # while decoding
        print(f"{name}; torch {torch.__version__}; Decompress, int8 coefficients in, batches of about 64 MB of output")
        t = time.perf_counter()
        result["decode_rows"] = gpu.decode_rows(args.device, args.sizes, args.cf, args.dtypes, args.repeat)
        result["seconds"]["decode_table"] = time.perf_counter() - t
        print(gpu.format_decode_rows(result["decode_rows"]), flush=True)
        print()
        setup.wait()
        result["seconds"]["setup"] = setup.seconds
        save()
        print(
            f"{args.samples} samples of 1x{args.size}x{args.size} (8-bit range) packed at {args.target_psnr:g} dB; "
            f"make_loader(batch_size, num_workers, pin_memory) -> DevicePrefetcher -> float32 model input on {dev}; "
            f"each epoch reads max({args.epoch_samples}, 4 x workers x batch) of them; best of {args.epochs} epochs "
            f"after one untimed; decode ms: median per batch of the decode call ({gpu.timer_name(dev)})",
            flush=True,
        )
        t = time.perf_counter()
        rows = gpu.pipeline_rows(args.device, setup, args.workers, args.batch, args.epochs, args.epoch_samples,
                                 on_row=save)  # fmt: skip
        result["seconds"]["pipeline"] = time.perf_counter() - t
    print()
    print(gpu.format_pipeline_rows(rows))
    print()
    result["complete"] = True
    save()
    print(gpu.format_must_show(result["must_show"]))
    print(f"{time.perf_counter() - t0:.0f} s" + (f"; rows: {args.json}" if args.json else ""))
    return 0


def _commit() -> str | None:
    """The checkout's commit (short), where this runs from a git checkout."""
    import subprocess

    try:
        got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return got.stdout.strip() or None if got.returncode == 0 else None


def _stream(args) -> int:
    import torch

    from benchmarks.stream import format_rows, run_stream_bench

    rate = None if args.rate_mbps <= 0 else args.rate_mbps * 1e6
    rows, meta = run_stream_bench(
        args.samples,
        args.size,
        args.samples_per_shard,
        args.workers,
        args.batch,
        args.epochs,
        args.quant,
        args.target_psnr,
        rate=rate,
        decode=not args.no_decode,
        only=args.only,
    )
    c = meta["codec"]
    print(
        f"torch {torch.__version__}; {meta['n']} samples of 1x{meta['size']}x{meta['size']} float32; dctdata cf={c.cf} "
        f"{c.mask} {c.dtype}, {meta['shards']} webdataset shards; DataLoader(num_workers={args.workers}, "
        f"batch_size={args.batch}, shuffled, persistent_workers); best of {args.epochs} epochs (local: after one "
        "untimed epoch, the loaders' epochs alternating); HTTP: loopback server "
        f"{'unthrottled' if rate is None else f'throttled to {args.rate_mbps:g} MB/s'}; "
        f"sha256 {meta['sha_GBps']:.2f} GB/s"
    )
    print(format_rows(rows, rate))
    return 0
