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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (`command` given) one whose other commands are listed by name and help only: a
    command module with NAME and HELP imports its heavy modules (torch) in `register`, so `dctdata --help` and
    the light commands start without them. `command=""`: every such command listed only."""
    from dctdata._version import __version__

    parser = argparse.ArgumentParser(
        prog="dctdata", description="Block-DCT compressed training sets for scientific ML."
    )
    parser.add_argument("--version", action="version", version=f"dctdata {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        if command is not None and getattr(module, "NAME", command) != command:
            sub.add_parser(module.NAME, help=module.HELP)
        else:
            module.register(sub)
    return parser


def _command(argv: list[str] | None) -> str:
    """The command named on the command line ("" for none: `dctdata --help`; the top-level options take no
    values, so it is the first word that is not an option). A word that is no command is refused by the
    parser, which lists every command either way."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return words[0] if words else ""


def _refuse_unknown(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Exit 2 with the command's own usage and, for a mistyped flag, the flag it most likely meant
    (argparse alone prints the top-level usage and no suggestion)."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
    hints = []
    for arg in unknown:
        if arg.startswith("-"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if close:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {close[0]}?")
    sub.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else ""))


def _starting(command: str, argv: list[str] | None) -> str:
    """The line a terminal shows while a command's modules (torch) load: its module's STARTING, unless
    --quiet or --help is given or stderr is not a terminal ("" then)."""
    words = sys.argv[1:] if argv is None else argv
    if not command or {"--quiet", "-h", "--help"} & set(words) or not sys.stderr.isatty():
        return ""
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "NAME", None) == command:
            return getattr(module, "STARTING", "")
    return ""


def main(argv: list[str] | None = None) -> int:
    command = _command(argv)
    starting = _starting(command, argv)
    if starting:  # the first progress line, before torch loads; the command's own bars overwrite it
        sys.stderr.write(f"\r{starting}")
        sys.stderr.flush()
    try:
        parser = build_parser(command)  # may import torch (pack, demo): a Ctrl-C here is one line too
    except KeyboardInterrupt:
        print(("\n" if starting else "") + "dctdata: interrupted", file=sys.stderr)
        return 130
    finally:
        if starting:
            sys.stderr.write("\r" + " " * len(starting) + "\r")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _refuse_unknown(parser, args.command, unknown)
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
