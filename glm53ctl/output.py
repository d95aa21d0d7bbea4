"""One Output object renders the same rows as a rich table or as JSON.

Data goes to stdout; progress, logs, warnings and errors go to stderr.
"""

from __future__ import annotations

import json
import sys
import time
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

    def table(
        self,
        title: str,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        key: str | None = None,
        width: int | None = None,
    ) -> None:
        """A rich table; under --json the caller emits the document itself (see `json`). `width`: at most so many
        columns, long cells wrapped (else as wide as the rows)."""
        if self.as_json:
            return
        t = Table(title=escape(title), title_justify="left", header_style="bold")
        for c in columns:
            t.add_column(c, overflow="fold")
        for r in rows:
            t.add_row(*("" if v is None else escape(str(v)) for v in r))
        self.out.print(t, width=width)

    def text(self, line: str) -> None:
        if not self.as_json:
            self.out.print(escape(line))

    def json(self, doc: Mapping[str, Any] | list[Any]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")

    def log(self, msg: str) -> None:
        err_console.print(escape(msg))


def print_error(message: str, hint: str | None = None) -> None:
    """`Error: ...` (+ `Hint: ...`) on stderr, every line of a multi-line message prefixed, so each one greps;
    messages are plain text, never rich markup."""
    for line in message.splitlines() or [""]:
        err_console.print(f"[red]Error:[/red] {escape(line)}")
    if hint:
        err_console.print(f"[dim]Hint:[/dim] {escape(hint)}")


def print_warning(message: str) -> None:
    for line in message.splitlines() or [""]:
        err_console.print(f"[yellow]Warning:[/yellow] {escape(line)}")


class Progress:
    """'[3/12, 0:42 elapsed, ~2:05 left]': keys done of the total, and an estimate from the mean so far."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def line(self, text: str) -> str:
        self.done += 1
        spent = time.monotonic() - self.t0
        left = spent / self.done * (self.total - self.done)
        eta = f", ~{_mmss(left)} left" if self.done < self.total else ""
        return f"  [{self.done}/{self.total}, {_mmss(spent)} elapsed{eta}] {text}"


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"
