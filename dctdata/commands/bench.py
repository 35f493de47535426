"""`dctdata bench KIND`: benchmarks; each kind is a module listed in BENCH_MODULES."""

from __future__ import annotations

import importlib

BENCH_MODULES = ("dctdata.bench.codec", "dctdata.bench.rd", "dctdata.bench.loader", "dctdata.bench.stream")


def register(sub) -> None:
    p = sub.add_parser("bench", help="throughput and rate-distortion benchmarks")
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(kinds)
