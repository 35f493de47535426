"""`dctdata verify OUT`: checksums of every stored file, a full decode of every sample, and counts; for a
trajectory pack, its figures per field, channel and time-step range, every frame checked against the floor
(`--source SRC`: measured again against the source).

Exit 0 when all is well; exit 1 listing each problem with the file/chunk and samples it affects.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("verify", help="check checksums, decode every sample, check counts (exit 1 on any problem)")
    p.add_argument("dataset", metavar="OUT", help="packed dataset directory or URL")
    p.add_argument("--no-decode", action="store_true", help="checksums and counts only")
    p.add_argument(
        "--source",
        metavar="SRC",
        help="a trajectory pack: its source (opened as the pack recorded it); every decoded frame is measured "
        "against it and each frame below its field's per-sample floor is reported",
    )
    p.add_argument(
        "--step-ranges",
        metavar="N|A:B,...",
        help="a trajectory pack: the time-step ranges of the fidelity table, a count of near-equal ranges or "
        "A:B,C:D (B left out: to the end; default 4 ranges)",
    )
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.verify import verify_dataset

    src = None if args.source is None else _open_source(args.dataset, args.source)
    try:
        problems, summary = verify_dataset(
            args.dataset,
            decode=not args.no_decode,
            reference=None if src is None else lambda a, b: next(src.batches(b - a, a, b))[1],
            describe=None if src is None else src.where,
            ranges=args.step_ranges,
        )
    finally:
        if src is not None:
            src.close()
    if summary.get("over_time"):
        against = "against the source" if src is not None else "recorded at pack time"
        print(f"fidelity over time ({against}; per frame: PSNR against its range, relative L2 ||x^ - x|| / ||x||):")
        for line in summary["over_time"]:
            print(line)
    for p in problems:
        print(f"FAIL {p}")
    if problems:
        print(f"dctdata verify: {len(problems)} problem(s) in {args.dataset}")
        return 1
    decoded = (
        "" if summary["decoded"] is None else f", {summary['decoded']} samples x {summary['fields']} fields decoded"
    )
    print(f"OK {args.dataset}: {summary['samples']} samples, {summary['files']} files checksummed{decoded}")
    return 0


def _open_source(dataset: str, source: str):
    """The pack's source, opened with the source options its manifest records (the HDF5 key, --time-dim, ...)."""
    from dctdata.format.manifest import read_manifest
    from dctdata.preprocess.sources import open_source

    m = read_manifest(dataset)
    options = {k: m.pack.get(k) for k in ("key", "sample_dim", "time_dim", "variables", "stack")}
    dims = 3 if any(f.codec is not None and f.codec.depth is not None for f in m.fields) else 2
    return open_source(source, channels_last=bool(m.pack.get("channels_last")), dims=dims, **options)
