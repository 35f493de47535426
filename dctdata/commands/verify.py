"""`dctdata verify OUT`: checksums of every stored file, a full decode of every sample, and counts.

Exit 0 when all is well; exit 1 listing each problem with the file/chunk and samples it affects.
"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("verify", help="check checksums, decode every sample, check counts (exit 1 on any problem)")
    p.add_argument("dataset", metavar="OUT", help="packed dataset directory or URL")
    p.add_argument("--no-decode", action="store_true", help="checksums and counts only")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from dctdata.verify import verify_dataset

    problems, summary = verify_dataset(args.dataset, decode=not args.no_decode)
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
