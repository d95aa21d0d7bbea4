"""Writing the files a command makes: atomically, with the mode a user expects, never over a read-only file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from glm53ctl.errors import UsageError


def check_replaceable(flag: str, path: Path) -> None:
    """Refuse, before any work, to write where a user would not expect a file to be replaced."""
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a folder")
    if not path.parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"{flag} {path}: folder {path.parent} is not writable")
    if path.exists() and (path.stat().st_mode & 0o222 == 0 or not os.access(path, os.W_OK)):
        raise UsageError(
            f"{flag} {path}: the file is read-only; glm53ctl does not replace it",
            hint="remove it or make it writable first, or pass another path",
        )
    if path.exists() and path.stat().st_mode & 0o444 == 0:  # the new file would keep the mode: unreadable too
        raise UsageError(
            f"{flag} {path}: the file is not readable; glm53ctl keeps a replaced file's mode, so it does not "
            "replace it",
            hint="remove it or make it readable first, or pass another path",
        )


def new_file_mode(path: Path) -> int:
    """The old file's mode when replacing one, else what the umask gives a new file."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic_with(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temp file in the same folder, then rename: a reader sees the old file or the new,
    never half; the new one gets `new_file_mode` (a temp file is made 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    """The text, fsynced, written atomically (`write_atomic_with`)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    write_atomic_with(path, write)
