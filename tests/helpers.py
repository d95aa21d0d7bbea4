"""Shared test helpers."""

from __future__ import annotations

import json
from pathlib import Path

from glm53ctl.cli import run_cli


def invoke(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process through its error boundary: (exit code, stdout, stderr)."""
    code = run_cli([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def invoke_json(capsys, *args: str) -> dict:
    code, out, err = invoke(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
