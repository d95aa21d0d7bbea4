"""`glm53ctl run`: one launch kind on the reference; every output and every write saved (issue 3)."""

from __future__ import annotations

import typer

from glm53ctl.errors import NotImplementedCommand


def register(app: typer.Typer) -> None:
    @app.command(
        name="run",
        help="Run one launch kind and save every output and every write. (not implemented yet)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run(ctx: typer.Context) -> None:
        raise NotImplementedCommand("`glm53ctl run` is not implemented yet (issue 3)")
