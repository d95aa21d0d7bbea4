"""A folder no one may write in, root included, for the tests of unwritable places."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """`path` (made if absent, with whatever is in it) read-only while inside. chmod does not stop root, so as
    root the folder is made immutable (`chattr +i`: no new, removed or renamed entry, for root too); where that
    cannot be done the test is skipped."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root, and chattr +i cannot make a folder read-only here")
    try:
        yield path
    finally:
        subprocess.run([chattr, "-i", str(path)], capture_output=True, check=True)
