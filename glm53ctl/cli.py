"""The glm53ctl command line. `main()` is the only error boundary.

The commands' modules import torch and the kernels at their top, so this one names them (`COMMANDS`) and loads a
command's module only when that command runs or shows its help: `glm53ctl -h`, `--version` and a mistyped
command load none of them.
"""

from __future__ import annotations

import difflib
import importlib
import os
import signal
import sys
import threading
import traceback
from typing import Annotated

import typer

from glm53ctl import __version__, interrupts
from glm53ctl.errors import EXIT_INTERRUPTED, EXIT_USAGE, Glm53Error
from glm53ctl.output import print_error

# Each command: the module that registers it (`register(app)`, or its own Typer `app` for a group) and its line in
# `glm53ctl -h` (the command's own first sentence: tests/cli/test_help.py holds them equal), in the help's order.
COMMANDS = {
    "run": (
        "run",
        "Run one launch kind and save every output and every write (plus its inputs) to a safetensors file.",
    ),
    "build": (
        "build",
        "Compile every kernel per build key ahead of time; registers, spills, shared memory, stack, code hash.",
    ),
    "check": (
        "check",
        "Accuracy against the reference, determinism, invariants; with --against, bitwise equality with REF; "
        "with --gpus T, every rank's outputs on real ranks bitwise equal to the one-device emulation.",
    ),
    "fault": (
        "check",
        "Stick each guarded wait on purpose: LaunchFault names it, nothing hangs, the retry is bitwise clean.",
    ),
    "compare": (
        "compare",
        "Every tensor of two saved runs: bitwise equal or not, B's relative RMS error against A, the largest "
        "difference; the worst first.",
    ),
    "bench": (
        "bench",
        "Time launches: µs per launch, bytes moved, the floor at the copy bandwidth and % of it; beside baselines "
        "and another git ref.",
    ),
    "report": (
        "report",
        "The evidence of a kernel change against REF in one document: bits (check), builds (build) and, on a GPU, "
        "time (bench) over the same keys; report.md for the pull request, report.json, and with --html one page.",
    ),
    "tune": ("tune", "Search each key's knobs with Optuna; keep a knob only where it measures faster (docs/knobs.md)."),
    "prune": (
        "prune",
        "Remove what --against and build keep in the cache folder: the worktrees of other refs, their builds, and "
        "build's compile cache; nothing else there.",
    ),
    "configs": ("configs", "Show, validate, diff and migrate the model and tuned-config files."),
}


# The commands that launch kernels where they run, in Triton's interpreter where there is no GPU. That is chosen
# before their module is imported: these modules import kernels at their top, and a `@triton.jit` function is made
# for the interpreter or the compiler when it is defined (one defined for the compiler, then called in the
# interpreter: "Cannot call @triton.jit'd outside of the scope of a kernel"). `build` compiles for the GPU on any
# machine; `bench` needs a GPU; `report` runs each part as its own command.
LAUNCHERS = ("run", "check", "fault", "tune")


def interpreter_where_no_gpu() -> None:
    """TRITON_INTERPRET=1 on a machine with no GPU, unless it is set already (0 keeps the compiler)."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"


def load_command(name: str):
    """The Click command `name` (COMMANDS), its module imported (for a launcher, after the interpreter is chosen
    where there is no GPU)."""
    if name in LAUNCHERS:
        interpreter_where_no_gpu()
    module = importlib.import_module(f"glm53ctl.commands.{COMMANDS[name][0]}")
    holder = typer.Typer(add_completion=False, rich_markup_mode=None)  # as the root's own
    if hasattr(module, "register"):
        module.register(holder)
    else:
        holder.add_typer(module.app)
    return typer.main.get_group(holder).commands[name]


class Commands(typer.core.TyperGroup):
    """The root group: its commands listed from COMMANDS, each loaded when asked for."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        return load_command(name) if name in COMMANDS else None

    def format_commands(self, ctx, formatter) -> None:
        """Click's list of commands, each line from COMMANDS (shortened as Click shortens a command's help)."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [
            (n, typer.core.TyperCommand(n, help=said).get_short_help_str(limit)) for n, (_, said) in COMMANDS.items()
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    cls=Commands,
    name="glm53ctl",
    help="Build, prove, fault-inject, tune and benchmark the GLM-5.3-Flash decode kernels on Hopper.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain help (flags without a type, no boxes); usage errors come through run_cli's one error style
    rich_markup_mode=None,
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


def run_cli(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code (0 ok, 1 a check failed, 2 usage/config error).

    The one error boundary: the project's errors and Typer's usage errors (an unknown command or option, a
    missing argument, a bad value) both print `Error:` and a hint on stderr. SIGINT and SIGTERM stop it at once
    (glm53ctl/interrupts.py): `Error: interrupted (SIGINT|SIGTERM) ...` and 130 or 143."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is threading.main_thread():
        interrupts.install()
    try:
        return _run(argv)
    finally:
        for s, handler in previous.items():
            if threading.current_thread() is threading.main_thread() and handler is not None:
                signal.signal(s, handler)


def _run(argv: list[str] | None) -> int:
    try:
        code = app(args=argv, prog_name="glm53ctl", standalone_mode=False)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except Glm53Error as e:
        if os.environ.get("GLM53CTL_DEBUG") == "1":
            traceback.print_exc()
        print_error(e.message, e.hint)
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        stop = interrupts.interrupted()
        print_error(stop.message)
        return stop.exit_code
    except Exception as e:
        usage = _usage_error(e)
        if usage is not None:
            return usage
        if _out_of_memory(e) and not interrupts.stopped():
            if os.environ.get("GLM53CTL_DEBUG") == "1":
                traceback.print_exc()
            said = ". ".join(str(e).split(". ")[:2])  # torch's first two sentences: what it asked for
            print_error(
                f"the GPU ran out of memory: {said}",
                "ask for fewer keys at once (--kind, --tp, --rows), or use a GPU with more memory; GLM53CTL_DEBUG=1 "
                "shows where",
            )
            return EXIT_USAGE
        if not interrupts.stopped():
            raise
        if os.environ.get("GLM53CTL_DEBUG") == "1":
            traceback.print_exc()
        stop = interrupts.interrupted()  # what the stop broke on its way out, said as the stop
        print_error(stop.message)
        return stop.exit_code
    if code == EXIT_INTERRUPTED:  # Typer's answer to a KeyboardInterrupt no command caught: Exit(130), silent
        stop = interrupts.interrupted()
        print_error(stop.message)
        return stop.exit_code
    return code if isinstance(code, int) else 0


def _out_of_memory(e: Exception) -> bool:
    """torch's CUDA out-of-memory error (known by name: the CLI does not import torch for itself)."""
    return type(e).__name__ == "OutOfMemoryError" and type(e).__module__.startswith("torch")


def _usage_error(e: Exception) -> int | None:
    """A Typer (Click) usage error as `Error:` + `Hint:`; None for any other exception. Typer's exceptions are
    recognized by what they have (its Click is vendored, not a public module)."""
    if not (hasattr(e, "format_message") and isinstance(getattr(e, "exit_code", None), int)):
        return None
    message = _no_such_option(e) or e.format_message()
    path = getattr(getattr(e, "ctx", None), "command_path", None) or "glm53ctl"
    if type(e).__name__ == "NoArgsIsHelpError":  # a group called bare: its help on stderr, then what is missing
        typer.echo(message, err=True)
        print_error("missing a command", f"`{path} -h` lists them; `{path} COMMAND -h` shows one's usage")
        return e.exit_code
    print_error(message, f"`{path} -h` shows the usage")
    return e.exit_code


def _no_such_option(e: Exception) -> str | None:
    """An unknown option, with the command's options that are close to it (Click's own cutoff suggests `--gpus`
    for `--bogus`): a near miss, a typo, suggested; nothing alike, nothing suggested."""
    ctx, name = getattr(e, "ctx", None), getattr(e, "option_name", None)
    if type(e).__name__ != "NoSuchOption" or ctx is None or not name:
        return None
    names = sorted({o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")})
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.8)
    return f"No such option: {name}" + (f" (did you mean {' or '.join(close)}?)" if close else "")


def main() -> None:
    sys.exit(run_cli())
