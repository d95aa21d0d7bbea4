"""Another git ref's code, checked out with `git worktree` and run in its own process (docs/design.md §7).

Two trees are never imported into one interpreter: the ref's glm53ctl runs in a child Python whose
import system maps `glm53ctl`, `glm53ctl.kernels`, `glm53ctl.tuning` and `glm53ctl.configs_data` onto
the ref's folders (the package-dir layout of docs/design.md §1), ahead of any installed copy.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from pathlib import Path

import glm53ctl
from glm53ctl.errors import UsageError
from glm53ctl.interrupts import run_group
from glm53ctl.paths import checkout_root

# installs, in any interpreter, an import finder that maps glm53ctl's packages onto the tree at ROOT
FINDER = r"""
import importlib.util, sys
from pathlib import Path

def _install_tree_finder(root):
    packages = {"glm53ctl.kernels": root / "kernels", "glm53ctl.tuning": root / "tuning",
                "glm53ctl.configs_data": root / "configs", "glm53ctl": root / "glm53ctl"}

    class TreeFinder:
        def find_spec(self, name, path=None, target=None):
            for pkg in sorted(packages, key=len, reverse=True):
                if name == pkg or name.startswith(pkg + "."):
                    base = packages[pkg].joinpath(*name[len(pkg):].split(".")[1:])
                    if (base / "__init__.py").exists():
                        return importlib.util.spec_from_file_location(
                            name, base / "__init__.py", submodule_search_locations=[str(base)])
                    if base.with_suffix(".py").exists():
                        return importlib.util.spec_from_file_location(name, base.with_suffix(".py"))
                    # never fall through to an installed copy of another tree
                    raise ModuleNotFoundError(f"No module named {name!r} in {root}", name=name)
            return None

    sys.meta_path.insert(0, TreeFinder())
"""

# run as `python -c BOOTSTRAP ROOT ARGS...`: the glm53ctl CLI of the tree at ROOT
BOOTSTRAP = (
    FINDER
    + r"""
_install_tree_finder(Path(sys.argv[1]))
sys.argv = ["glm53ctl", *sys.argv[2:]]
from glm53ctl.cli import main
main()
"""
)


def finder_code(root: Path) -> str:
    """Code for `exec` in a worker process: import glm53ctl from `root`, whatever is installed."""
    return FINDER + f"\n_install_tree_finder(Path({str(root)!r}))\n"


def this_tree() -> Path:
    """The folder holding the running glm53ctl's glm53ctl/ (and, in a checkout, kernels/ and tuning/)."""

    return Path(glm53ctl.__file__).resolve().parent.parent


def git(root: Path, *args: str) -> str:
    p = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if p.returncode:
        raise UsageError(f"git {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout.strip()


def repo_root() -> Path:
    root = checkout_root()
    if root is None or not (root / ".git").exists():
        raise UsageError("--against needs glm53ctl to run from a git checkout", hint="pip install -e . in a clone")
    return root


def resolve(ref: str, root: Path) -> str:
    p = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=root, capture_output=True, text=True
    )
    if p.returncode:
        raise UsageError(f"no git ref {ref!r} in {root}", hint="a branch, tag or commit: git log --oneline")
    return p.stdout.strip()


def checkout(ref: str, cache: Path) -> tuple[Path, str]:
    """The ref's tree in cache/worktrees/<sha> (made once, reused) and its commit sha. A folder holding a
    glm53ctl tree (a worktree copied to a machine with no git history, say) is taken as it is.

    Safe when several runs ask at once (two terminals, two CI jobs in one clone): the tree is made under a lock of
    its own (cache/locks/<sha>.lock, a line on stderr while another run holds it), a run only ever removes a
    tree it failed to make itself, and a tree left broken (a folder git does not know, an interrupted checkout) is
    made again."""
    tree = Path(ref)
    # a path (it has a slash or starts with a dot), so a folder never shadows a ref of the same name
    if "/" in ref or ref.startswith("."):
        if (tree / "glm53ctl" / "__init__.py").is_file():
            return tree.resolve(), f"tree {tree.resolve().name}"
        if tree.is_dir():
            raise UsageError(
                f"--against {ref}: a folder, but not a glm53ctl tree (no glm53ctl/__init__.py in it)",
                hint="a git ref (a branch, tag or commit), or the folder of a glm53ctl checkout",
            )
    root = repo_root()
    sha = resolve(ref, root)
    path = cache / "worktrees" / sha[:12]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"{cache}: cannot make {path.parent} ({e.strerror})",
            hint="a folder this user can write (--worktrees DIR; build's --out DIR): other refs' worktrees go there",
        ) from None
    locks = cache / "locks"  # beside worktrees/, which holds trees alone
    locks.mkdir(exist_ok=True)
    with _locked(locks / f"{sha[:12]}.lock", f"{ref} ({sha[:12]})"):
        if not _whole(path, sha):
            _make(root, path, sha)
    return path, sha


def _whole(path: Path, sha: str) -> bool:
    """Whether `path` is a finished worktree of `sha` (its checkout ran to the end)."""
    if not (path / ".git").is_file() or not (path / "glm53ctl" / "__init__.py").is_file():
        return False
    p = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True)
    return p.returncode == 0 and p.stdout.strip() == sha


def _make(root: Path, path: Path, sha: str) -> None:
    """The worktree of `sha` at `path`, whatever was there (a broken tree of an earlier run) removed first."""
    if path.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(path.resolve())], cwd=root, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
    git(root, "worktree", "prune")
    try:
        git(root, "worktree", "add", "--detach", "--force", str(path.resolve()), sha)
    except BaseException:  # an interrupt or a failure mid-checkout: no half-made tree is taken next time
        subprocess.run(["git", "worktree", "remove", "--force", str(path.resolve())], cwd=root, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
        raise


@contextlib.contextmanager
def _locked(lock: Path, what: str):
    """An exclusive lock on `lock` (a file beside the tree), waited for with a line on stderr."""
    import fcntl

    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"waiting for another run making the worktree of {what}\n")
            sys.stderr.flush()
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_cli(tree: Path, args: list[str], capture_stderr: bool = False) -> subprocess.CompletedProcess:
    """The glm53ctl of `tree` with `args`, in a child process (stdout captured; stderr passed through), killed
    with its workers if this one is interrupted."""
    return run_group(
        [sys.executable, "-c", BOOTSTRAP, str(tree), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if capture_stderr else None,
        text=True,
    )
