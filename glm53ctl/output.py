"""One Output object renders the same rows as a rich table or as JSON.

Data goes to stdout; progress, logs, warnings and errors go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from glm53ctl.interrupts import interrupted, whole_line

# soft_wrap: an error line names a file and a key path; it must stay one greppable line
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Output:
    def __init__(self, as_json: bool = False, verbose: bool = False) -> None:
        self.as_json = as_json
        self.verbose = verbose
        # piped or in a file: 100 columns, as on a terminal (a long cell folds onto more lines, never cut); a line
        # of text (soft_wrap) stays one greppable line
        self.out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 100)

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
    """'[3/12, 0:42 elapsed, ~2:05 left] ...': keys done of the total, and an estimate of the time left from the
    work done so far, each key weighed by its `costs` (the tasks its launches run: the interpreter's time goes
    with them; a kind of small tables early no longer promises "~0:20 left" five minutes before the end)."""

    def __init__(self, total: int, costs: list[float] | None = None, unit: str = "keys") -> None:
        self.total, self.done, self.unit, self.t0 = total, 0, unit, time.monotonic()
        self.cost_total = float(sum(costs)) if costs else float(total)
        self.cost_done = 0.0

    def line(self, text: str, cost: float = 1.0) -> str:
        self.done += 1
        self.cost_done += cost
        spent = time.monotonic() - self.t0
        left = spent / max(self.cost_done, 1e-9) * max(self.cost_total - self.cost_done, 0.0)
        eta = f", ~{_mmss(left)} left" if self.done < self.total else ""
        return f"  [{self.done}/{self.total}, {_mmss(spent)} elapsed{eta}] {text}"

    @contextmanager
    def stops(self, what: str) -> Iterator[None]:
        """An interrupt inside: `Error: interrupted (SIGINT): 3 of 12 keys checked` and exit 130 (the finished
        keys' lines are above it)."""
        try:
            yield
        except KeyboardInterrupt:
            raise interrupted(f"{self.done} of {plural(self.total, self.unit)} {what}") from None


class Heartbeat:
    """Within a long key, a line on stderr every `every` seconds with where it is ('... tiny/kda/tp2/r8: 120 of
    483 sites stuck, 1:40 in this key'): a key may take minutes under the interpreter. Called with where it is
    now; `GLM53CTL_HEARTBEAT_S` sets the period (0: none). Plain prints: it runs in worker processes too."""

    def __init__(self, key: str, every: float | None = None) -> None:
        self.key, self.at, self.t0 = key, "starting", time.monotonic()
        self.every = float(os.environ.get("GLM53CTL_HEARTBEAT_S", "20")) if every is None else every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, at: str) -> None:
        self.at = at

    def __enter__(self) -> Heartbeat:
        if self.every > 0:
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every):
            spent = _mmss(time.monotonic() - self.t0)
            whole_line(f"    ... {self.key}: {self.at}, {spent} in this key")


def plural(n: int, noun: str, one: str | None = None) -> str:
    """'1 key', '3 keys' (`noun` in the plural, as the counts say it; `one` where the singular is not it less
    its s: 'process')."""
    return f"{n} {noun if n != 1 else one or noun.removesuffix('s')}"


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"
