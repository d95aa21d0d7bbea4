"""Commands whose issue has not landed: each exits 2 with one line saying so, and never fakes output."""

from __future__ import annotations

import typer

from glm53ctl.commands import Command
from glm53ctl.errors import NotImplementedCommand

# command -> (what it will do, the issue that builds it)
PENDING = {
    "tune": ("Search per-width knobs with Optuna; keep a knob only where it measures faster.", 18),
    "bench": ("Time launches against the bandwidth floor and another git ref.", 18),
}


def register(app: typer.Typer) -> None:
    for name, (help_text, issue) in PENDING.items():
        app.command(
            name=name,
            cls=Command,
            help=f"{help_text} Not built yet (issue {issue}): exits 2; it takes no options until then.",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )(_pending(name, issue))


def _pending(name: str, issue: int | None):
    def command(ctx: typer.Context) -> None:
        where = f" (issue {issue})" if issue else ""
        raise NotImplementedCommand(f"`glm53ctl {name}` is not implemented yet{where}")

    command.__name__ = name
    return command
