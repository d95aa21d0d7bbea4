"""What the command tests share: a copy of this project as a git repository of its own, to edit and commit in."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def repo(tmp_path):
    """A copy of this project's tracked files as a fresh git repository with one commit."""
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "one")
    return repo


def edit(repo, path, old, new):
    """`old` replaced by `new` in one file of `repo`, committed."""
    f = repo / path
    text = f.read_text()
    assert old in text, old
    f.write_text(text.replace(old, new))
    git(repo, "commit", "-qam", f"edit {path}")
