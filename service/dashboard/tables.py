"""Tables of the dashboard: columns, a page of rows, and the CSV and JSON downloads of a table.

A page builds its tables from SQL that already sorted, filtered and cut the rows to one page
(:class:`Paging`); the same rows download as CSV or JSON when the page's URL carries
``format=csv`` or ``format=json`` (and ``table=NAME`` on a page with several tables), so
whatever filters the page shows, the download holds.

Cells are plain values (``str``, numbers, ``None``, or a :class:`Link`), the same in the HTML
table and in the downloads; a column's ``kind`` says how the HTML shows it. In a CSV download a
text cell that a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, a
tab or a carriage return: names are chosen by readers, submitters and workers) starts with a
single quote instead, as OWASP advises; numbers, and text that is a plain number, stay as they are.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.responses import Response

from tiletune.service.errors import InvalidInputError

#: How the HTML shows a cell: as text, a time in ms, a ratio, a speedup (coloured), a time of day.
Kind = Literal["text", "ms", "ratio", "speedup", "when", "number", "config"]

MAX_PER_PAGE = 500
DEFAULT_PER_PAGE = 50

#: First characters that make a spreadsheet read a cell as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: Text that is a plain decimal number (a spreadsheet reads it as that number, never a formula).
PLAIN_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class Link:
    """A cell that links somewhere: ``text`` shown, ``href`` followed (downloads hold the text)."""

    text: str
    href: str


@dataclass(frozen=True)
class Column:
    """A table column: its key in the rows, its title, how cells show, and whether it sorts."""

    key: str
    title: str
    kind: Kind = "text"
    sortable: bool = False


@dataclass
class Table:
    """One page of a table's rows, with the total row count when the table pages."""

    name: str
    columns: Sequence[Column]
    rows: list[dict[str, Any]]
    total: int | None = None
    paging: Paging | None = None
    sort: str | None = None
    descending: bool = False
    empty: str = "nothing yet"
    classes: dict[str, str] = field(default_factory=dict)

    @property
    def pages(self) -> int:
        """How many pages the table has (1 when it does not page)."""
        if self.total is None or self.paging is None:
            return 1
        return max(1, math.ceil(self.total / self.paging.per_page))


@dataclass(frozen=True)
class Paging:
    """Which page of a table (1-based) and how many rows a page has."""

    page: int = 1
    per_page: int = DEFAULT_PER_PAGE

    @property
    def offset(self) -> int:
        """Rows before this page."""
        return (self.page - 1) * self.per_page


def paging(
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=MAX_PER_PAGE)] = DEFAULT_PER_PAGE,
) -> Paging:
    """The ``page`` and ``per_page`` query parameters (a dependency)."""
    return Paging(page, per_page)


Format = Annotated[Literal["html", "csv", "json"], Query(description="html, or a download: csv | json")]


def sort_key(sort: str | None, allowed: Sequence[str], default: str) -> tuple[str, bool]:
    """A ``sort`` parameter (``name`` or ``-name`` for descending) checked against ``allowed``."""
    if sort is None or sort == "":
        sort = default
    name = sort.removeprefix("-")
    if name not in allowed:
        raise InvalidInputError(f"cannot sort by {name!r}; choose one of {sorted(allowed)}", field="sort")
    return name, sort.startswith("-")


def _plain(value: Any) -> Any:
    if isinstance(value, Link):
        return value.text
    return value


def _csv_cell(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, int | float):
        return str(value)
    return inert(str(value))


def inert(text: str) -> str:
    """``text`` as a CSV cell no spreadsheet runs as a formula (a plain number is left as it is)."""
    if text.startswith(FORMULA_STARTS) and not PLAIN_NUMBER.fullmatch(text):
        return "'" + text
    return text


def download(table: Table, fmt: Literal["csv", "json"]) -> Response:
    """The table's rows as a CSV or JSON file (its columns, in order, by key)."""
    keys = [column.key for column in table.columns]
    filename = f"tiletune-{table.name}.{fmt}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"', "Cache-Control": "no-store"}
    if fmt == "json":
        rows = [{key: _plain(row.get(key)) for key in keys} for row in table.rows]
        return Response(json.dumps(rows, default=str), media_type="application/json", headers=headers)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([inert(key) for key in keys])  # the coverage table's keys are chip names
    for row in table.rows:
        writer.writerow([_csv_cell(row.get(key)) for key in keys])
    return Response(buffer.getvalue(), media_type="text/csv; charset=utf-8", headers=headers)


def pick(tables: Sequence[Table], name: str | None) -> Table:
    """The table a download asks for: ``name``, else the page's first."""
    if name is None:
        return tables[0]
    for table in tables:
        if table.name == name:
            return table
    raise InvalidInputError(
        f"this page has no table {name!r}; choose one of {[t.name for t in tables]}", field="table"
    )
