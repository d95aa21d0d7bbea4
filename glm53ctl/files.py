"""Writing the files a command makes: atomically, with the mode a user expects, never over a read-only file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from glm53ctl.errors import UsageError


def _named(flag: str, path: Path) -> str:
    """How an error names the path: after its option (`--out x`), or alone (a FILE argument)."""
    return f"{flag} {path}" if flag else str(path)


def _not_writable(folder: Path) -> str:
    """Why a folder takes no new file (os.access says so for root too on a read-only mount or an immutable
    folder, where chmod alone does not stop root)."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    name = f"the working folder {Path.cwd()}" if folder == Path(".") else f"folder {folder}"
    return f"{name} is not writable" + (" (a read-only file system)" if read_only else "")


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_folder_writable(flag: str, folder: Path) -> None:
    """Refuse, before any work, a folder a command will make (if absent) and write into: its nearest existing
    ancestor must be a folder we may write in (a path under a regular file fails even for root)."""
    at = _nearest_existing(folder)
    if not at.is_dir():
        raise UsageError(
            f"{_named(flag, folder)}: {at} is a file, not a folder", hint=f"pass {flag or 'a path'} elsewhere"
        )
    if not os.access(at, os.W_OK | os.X_OK):
        raise UsageError(
            f"{_named(flag, folder)}: {_not_writable(at)}",
            hint=f"pass {flag + ' DIR' if flag else 'a folder'} where you may write",
        )
    _trial_write(_named(flag, folder), at, f"pass {flag + ' DIR' if flag else 'a folder'} where you may write")


def _trial_write(where: str, folder: Path, hint: str) -> None:
    """A file made and removed in `folder`: what permissions allow can still fail (a read-only mount, /proc, a full
    disk), and a command should say so before its work, not after."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".glm53ctl-trial-"):
            pass
    except OSError as e:
        raise UsageError(f"{where}: cannot write in {folder} ({e.strerror or e})", hint=hint) from None


def check_replaceable(flag: str, path: Path, hint: str | None = None) -> None:
    """Refuse, before any work, to write where a user would not expect a file to be replaced. `flag`: the option
    naming the path ("" for an argument); `hint`: what to do about a read-only file or folder."""
    where = _named(flag, path)
    if path.is_dir():
        raise UsageError(f"{where}: is a folder")
    if not (at := _nearest_existing(path.parent)).is_dir():
        raise UsageError(f"{where}: {at} is a file, not a folder")
    if not path.parent.is_dir():
        raise UsageError(f"{where}: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"{where}: {_not_writable(path.parent)}", hint=hint or "pass another path, or make it writable"
        )
    _trial_write(where, path.parent, hint or "pass another path")
    if path.exists() and (path.stat().st_mode & 0o222 == 0 or not os.access(path, os.W_OK)):
        raise UsageError(
            f"{where}: the file is read-only; glm53ctl does not replace it",
            hint=hint or "remove it or make it writable first, or pass another path",
        )
    if path.exists() and path.stat().st_mode & 0o444 == 0:  # the new file would keep the mode: unreadable too
        raise UsageError(
            f"{where}: the file is not readable; glm53ctl keeps a replaced file's mode, so it does not replace it",
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
