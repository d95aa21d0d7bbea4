"""One Output object renders the same rows as a rich table or as JSON (STYLE.md 14).

Data goes to stdout; progress, logs, warnings and errors go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

# soft_wrap: an error line names a file and a key path; it must stay one greppable line
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Output:
    def __init__(self, as_json: bool = False, verbose: bool = False) -> None:
        self.as_json = as_json
        self.verbose = verbose
        # piped: wide enough that a table never cuts a path (the data itself)
        self.out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], key: str | None = None) -> None:
        """A rich table; under --json the caller emits the document itself (see `json`)."""
        if self.as_json:
            return
        t = Table(title=escape(title), title_justify="left", header_style="bold")
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*("" if v is None else escape(str(v)) for v in r))
        self.out.print(t)

    def text(self, line: str) -> None:
        if not self.as_json:
            self.out.print(escape(line))

    def json(self, doc: Mapping[str, Any] | list[Any]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")

    def log(self, msg: str) -> None:
        err_console.print(escape(msg))


def print_error(message: str, hint: str | None = None) -> None:
    """`Error: ...` (+ `Hint: ...`) on stderr; messages are plain text, never rich markup."""
    err_console.print(f"[red]Error:[/red] {escape(message)}")
    if hint:
        err_console.print(f"[dim]Hint:[/dim] {escape(hint)}")


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]Warning:[/yellow] {escape(message)}")
