"""`dctdata` console script: a thin argparse front over dctdata/commands/*.

Each command module defines `register(subparsers)` which adds its parser and sets `func`; command
modules import their library code inside `func`, so `--help` stays fast. Errors a user can cause
(`DctDataError`: bad input, settings or stored data; `OSError`: missing, unreadable or full paths)
print one line and exit 1, without a traceback (`--debug` shows it). Anything else is a bug and keeps
its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dctdata.errors import DctDataError

# One module per subcommand; add a line here when adding a command.
COMMAND_MODULES = (
    "dctdata.commands.demo",
    "dctdata.commands.bench_moved",
    "dctdata.commands.pack",
    "dctdata.commands.info",
    "dctdata.commands.verify",
    "dctdata.commands.inspect",
)


# Third-party loggers whose DEBUG output floods `--debug` (PIL logs every TIFF tag it reads).
QUIET_LOGGERS = ("PIL", "fsspec", "asyncio", "urllib3", "numcodecs")


def build_parser() -> argparse.ArgumentParser:
    from dctdata._version import __version__

    parser = argparse.ArgumentParser(
        prog="dctdata", description="Block-DCT compressed training sets for scientific ML."
    )
    parser.add_argument("--version", action="version", version=f"dctdata {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # imports torch through the commands: a Ctrl-C here is one line too
    except KeyboardInterrupt:
        print("dctdata: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    for name in QUIET_LOGGERS:  # --debug is for dctdata's own log, not a line per TIFF tag
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        return int(args.func(args) or 0)
    except (DctDataError, OSError) as exc:  # OSError: missing/unwritable paths, read-only or full disks
        if args.debug:
            raise
        msg = str(exc) if not isinstance(exc, OSError) or not exc.filename else f"{exc.strerror}: {exc.filename}"
        print(f"dctdata {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"dctdata {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
