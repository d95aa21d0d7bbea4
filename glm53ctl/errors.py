"""Expected failures. `cli.main` is the only place that turns them into `Error:` + `Hint:` and an exit code."""

from __future__ import annotations

# Exit codes (docs/design.md §7)
EXIT_OK = 0
EXIT_FAILED = 1  # a check, fault test or regression failed
EXIT_USAGE = 2  # usage or configuration error
EXIT_INTERRUPTED = 130  # SIGINT (128 + SIGINT, as shells report a Ctrl-C)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM)


class Glm53Error(Exception):
    """A user-facing error: a message, an optional hint, an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(Glm53Error):
    """A wrong flag or value."""


class ConfigError(Glm53Error):
    """A model or tuned-config file that cannot be read, validated or migrated."""


class NotImplementedCommand(Glm53Error):
    """A command whose issue has not landed: it exits 2 and never fakes output."""


class CheckFailed(Glm53Error):
    """A check, fault test or regression ran and failed."""

    exit_code = EXIT_FAILED


class Interrupted(Glm53Error):
    """SIGINT or SIGTERM stopped the command (glm53ctl/interrupts.py): what finished, exit 130 or 143 (128 + the
    signal's number, as a shell reports a process the signal ended)."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_INTERRUPTED) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code
