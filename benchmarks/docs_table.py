"""`python -m benchmarks docs-table RESULT.json`: a benchmark's JSON as a table for the documentation's
benchmark pages (docs/benchmarks/), headed by its command, machine and date as those pages have them.

Why: a figure in the docs must be one that was measured, with where and when. Copying numbers from a
terminal by hand is how figures drift; this prints the rows of the JSON the run wrote (`--json`/`--out` of
the benchmarks), so a page's table is the run's. The JSON is a list of row objects, or an object with one
(`--rows KEY` picks it when there are several: gpu-layer writes `decode` and `nvcomp`). A row's nested
objects are left out; `--columns` picks and orders the columns.

    python -m benchmarks device-decode --device cuda --json dd.json
    python -m benchmarks docs-table dd.json --date 2026-11-26 --commit abc1234 \\
        --command "python -m benchmarks device-decode --device cuda"

The machine is the JSON's `device` when it has one, else `--machine` (required then): the run's machine
is not this one in general, so it is never guessed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from typing import Any

from dctdata.errors import DctDataError

PROG = "python -m benchmarks docs-table"


def find_rows(result: Any, key: str | None, where: str) -> list[dict]:
    """The list of row objects in `result`: itself, result[key], or its one list of objects."""
    if key is not None:
        if not isinstance(result, dict) or key not in result:
            keys = sorted(result) if isinstance(result, dict) else []
            raise DctDataError(f"{where}: expected a key {key!r} holding the rows. Got keys {keys}")
        result = result[key]
    if isinstance(result, dict):
        lists = [k for k, v in result.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
        if len(lists) != 1:
            raise DctDataError(
                f"{where}: expected one list of row objects, or --rows KEY to pick one. Got {sorted(lists) or 'none'}"
            )
        result = result[lists[0]]
    if not isinstance(result, list) or not result or not all(isinstance(r, dict) for r in result):
        raise DctDataError(f"{where}: expected a non-empty list of row objects. Got {type(result).__name__}")
    return result


def cell(value: Any) -> str:
    """One value as the docs write it: thousands separators, 3 significant digits for fractions."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == int(value) and abs(value) >= 1:
            return f"{int(value):,}"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> list[str]:
    """Rows as Markdown table lines; numbers right-aligned."""
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k, v in row.items() if k not in columns and not isinstance(v, (dict, list))]
    missing = [c for c in columns if not any(c in row for row in rows)]
    if missing:
        raise DctDataError(f"--columns: no row has {missing}. The rows have {sorted({k for r in rows for k in r})}")
    numeric = [all(_is_number(r.get(c)) or r.get(c) is None for r in rows) for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def render(
    result: Any,
    *,
    command: str,
    date: str,
    machine: str | None,
    commit: str | None = None,
    rows_key: str | None = None,
    columns: list[str] | None = None,
    where: str = "result",
) -> str:
    """The page block: command, machine, recorded date (and commit), then the table."""
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise DctDataError(f"--date: expected YYYY-MM-DD. Got {date!r}") from None
    device = result.get("device") if isinstance(result, dict) else None
    if not machine and not device:
        raise DctDataError(f"{where}: the JSON names no device: pass --machine (where the run was measured)")
    machine = machine or str(device)
    recorded = f"{date} (commit `{commit}`)" if commit else date
    head = [f"- **Command:** `{command}`.", f"- **Machine:** {machine}.", f"- **Recorded:** {recorded}.", ""]
    return "\n".join(head + markdown_table(find_rows(result, rows_key, where), columns)) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("json", metavar="RESULT.json", help="what the benchmark wrote (--json / --out)")
    p.add_argument("--command", required=True, help="the command that wrote it, as the page shows it")
    p.add_argument("--date", required=True, help="the day it was measured, YYYY-MM-DD")
    p.add_argument("--commit", default=None, help="the commit it measured")
    p.add_argument("--machine", default=None, help="where it ran (default: the JSON's device; required without)")
    p.add_argument("--rows", default=None, metavar="KEY", help="the key of the rows, where the JSON has several")
    p.add_argument("--columns", default=None, metavar="A,B,...", help="the columns, in order (default: every one)")
    args = p.parse_args(argv)
    try:
        with open(args.json, encoding="utf-8") as fh:
            result = json.load(fh)
    except json.JSONDecodeError as exc:
        raise DctDataError(f"{args.json}: expected a benchmark's JSON. Got {exc}") from None
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    page = render(
        result,
        command=args.command,
        date=args.date,
        machine=args.machine,
        commit=args.commit,
        rows_key=args.rows,
        columns=columns,
        where=args.json,
    )
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    main()
