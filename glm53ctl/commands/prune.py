"""`glm53ctl prune`: remove what `--against` and `build` keep between runs (git worktrees of other refs, the
compile cache), so the cache folder does not grow without end."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.output import Output


def register(app: typer.Typer) -> None:
    app.command(name="prune", cls=Command)(prune)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def prune(
    cache: Annotated[
        Path, typer.Option("--cache", metavar="DIR", help="The cache folder of --against and build.")
    ] = Path("build"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="What was removed, as JSON on stdout.")] = False,
) -> None:
    """Remove the worktrees that --against checked out and the compile cache of build."""
    o = Output(as_json)
    items = sorted((cache / "worktrees").glob("*")) if (cache / "worktrees").is_dir() else []
    if (cache / "cache").is_dir():
        items.append(cache / "cache")
    removed = [{"path": str(p), "bytes": _size(p)} for p in items]
    if not dry_run:
        for p in items:
            shutil.rmtree(p)
        if any(p.parent.name == "worktrees" for p in items):
            from glm53ctl.worktree import git, repo_root

            git(repo_root(), "worktree", "prune")  # forget the removed worktrees in the repository too
    freed = sum(r["bytes"] for r in removed)
    o.json({"cache": str(cache), "dry_run": dry_run, "removed": removed, "bytes": freed})
    verb = "would remove" if dry_run else "removed"
    for r in removed:
        o.text(f"{verb} {r['path']} ({r['bytes'] / 2**20:.1f} MiB)")
    o.text(f"{verb} {len(removed)} items, {freed / 2**20:.1f} MiB" if removed else f"nothing to prune in {cache}")
