"""The glm53ctl command line. `main()` is the only error boundary (STYLE.md 13).

No module-level torch/triton/optuna here or in commands/: `--help` stays fast.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated

import typer

from glm53ctl import __version__
from glm53ctl.commands import build, check, configs, pending, run
from glm53ctl.errors import EXIT_USAGE, Glm53Error
from glm53ctl.output import print_error

app = typer.Typer(
    name="glm53ctl",
    help="Build, prove, fault-inject, tune and benchmark the GLM-5.3-Flash decode kernels on Hopper.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"glm53ctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """glm53ctl: one persistent Triton launch per kind, proven against a PyTorch reference and other git refs."""


app.add_typer(configs.app)
run.register(app)
build.register(app)
check.register(app)
pending.register(app)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code (0 ok, 1 a check failed, 2 usage/config error)."""
    try:
        app(args=argv, prog_name="glm53ctl")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except Glm53Error as e:
        if os.environ.get("GLM53CTL_DEBUG") == "1":
            traceback.print_exc()
        print_error(e.message, e.hint)
        return e.exit_code
    return 0


def main() -> None:
    sys.exit(run_cli())
