"""`dctdata bench`: the benchmarks left the installed package for the repository's `benchmarks/` folder
(they need the peers' libraries and package-shipped photos, which the product does not depend on).
The command stays as a one-line pointer, so an old command line says where its tables went."""

from __future__ import annotations

import argparse

MOVED = (
    "the benchmarks are not part of the installed package: run `python -m benchmarks {kind}` from the root "
    'of a dctdata checkout (pip install -e ".[dev]"; see benchmarks/README.md)'
)


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="moved: `python -m benchmarks NAME` in a checkout of the repository",
        description="The benchmarks moved to the repository's benchmarks/ folder: run `python -m benchmarks NAME` "
        "from the root of a checkout (`python -m benchmarks --help` lists them).",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="ignored")
    p.set_defaults(func=_moved)


def _moved(args) -> int:
    from dctdata.errors import DctDataError

    raise DctDataError(MOVED.format(kind=args.args[0] if args.args else "NAME"))
