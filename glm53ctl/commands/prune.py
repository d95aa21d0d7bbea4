"""`glm53ctl prune`: remove what `--against` and `build` keep between runs (git worktrees of other refs, the
compile cache), so the cache folder does not grow without end."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.errors import UsageError
from glm53ctl.output import Output, plural
from glm53ctl.worktree import git, repo_root


def register(app: typer.Typer) -> None:
    app.command(name="prune", cls=Command)(prune)


def _is_compile_cache(path: Path) -> bool:
    """build's cache: a folder of <sha256>.json records and nothing else."""
    return path.is_dir() and all(re.fullmatch(r"[0-9a-f]{64}\.json", f.name) for f in path.iterdir())


def _forget_worktrees() -> None:
    """`git worktree prune` in the repository, so it forgets the removed worktrees (none to do outside one)."""

    try:
        root = repo_root()
    except UsageError:
        return
    git(root, "worktree", "prune")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def prune(
    cache: Annotated[
        Path | None,
        typer.Option("--cache", metavar="DIR", help="The cache folder of --against and build (default: build)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="What was removed, as JSON on stdout.")] = False,
) -> None:
    """Remove what --against and build keep in the cache folder: the worktrees of other refs, their builds, and
    build's compile cache; nothing else there."""
    o = Output(as_json)
    # a folder named and absent is a typo, not "nothing to prune"; the default build/ may not exist yet
    named, cache = cache is not None, cache or Path("build")
    if cache.exists() and not cache.is_dir():
        raise UsageError(
            f"--cache {cache}: is a file, not a folder",
            hint="pass the folder that `build --out` or `--against` used (default: build)",
        )
    if named and not cache.exists():
        raise UsageError(
            f"--cache {cache}: no such folder",
            hint="pass the folder that `build --out` or `--against` used (default: build)",
        )
    # what glm53ctl made there, and only that: worktrees it checked out (each has git's .git file) and their locks,
    # the builds of other refs (`build --against`), the compile cache and the kernel cache (`build`)
    trees = sorted(p for p in (cache / "worktrees").glob("*") if (p / ".git").is_file())
    items = trees + sorted(p for p in (cache / "ref").glob("*") if (p / "manifest.json").is_file())
    if _is_compile_cache(cache / "cache"):
        items.append(cache / "cache")
    if (cache / "kernels" / "CACHE.json").is_file():
        items.append(cache / "kernels")
    locks = cache / "locks"
    if locks.is_dir() and all(p.suffix == ".lock" for p in locks.iterdir()):
        items.append(locks)
    removed = [{"path": str(p), "bytes": _size(p)} for p in items]
    if not dry_run:
        for p in items:
            try:
                shutil.rmtree(p)
            except OSError as e:  # a read-only cache folder: what was removed before it stays removed
                raise UsageError(
                    f"--cache {cache}: cannot remove {e.filename or p} ({e.strerror})",
                    hint="make the cache folder writable, or remove it yourself",
                ) from None
        if trees:
            _forget_worktrees()
    freed = sum(r["bytes"] for r in removed)
    o.json({"cache": str(cache), "dry_run": dry_run, "removed": removed, "bytes": freed})
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        o.text(f"{verb} {r['path']} ({r['bytes'] / 2**20:.1f} MiB)")
    o.text(
        f"{verb} {plural(len(removed), 'items')}, {freed / 2**20:.1f} MiB"
        if removed
        else f"nothing to prune in {cache}" + ("" if cache.exists() else " (no such folder here)")
    )
