"""Ctrl-C and SIGTERM on real `check`, `fault` and `build` runs (issue 30): the workers stop at once, stderr says
`Error: interrupted (SIG...)` and what finished, exit 130 (SIGINT) or 143 (SIGTERM), and nothing is left behind: no
process (every one the run started carries a marker in its environment), no temporary file, no half-made worktree.
Before: SIGINT during a parallel `fault` hung, `check` and `build` kept both cores busy for minutes, Typer's
Exit(130) hid the message, and SIGTERM left `/tmp/glm53ctl-against-*` and the ref's worker behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.interpreter, pytest.mark.slow]


def _marked(mark: str) -> list[int]:
    """The live processes whose environment carries `mark` (zombies have none left to read)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            if mark.encode() in Path(f"/proc/{d}/environ").read_bytes():
                found.append(int(d))
        except OSError:
            continue
    return found


def _interrupt(tmp_path: Path, args: list[str], sig: signal.Signals, after: str, settle_s: float = 4.0):
    """Run glm53ctl `args` in a session of its own; once stderr shows `after` and `settle_s` more seconds have
    passed (the workers busy on their keys), send `sig`: SIGINT to the whole group, as a terminal's Ctrl-C does,
    SIGTERM to the command alone, as `kill` does. Returns (exit code, stderr, seconds from the signal to the end,
    the marker)."""
    mark = f"glm53ctl-signal-test-{uuid.uuid4().hex}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = os.environ | {"TMPDIR": str(tmp), "GLM53CTL_SIGNAL_TEST": mark, "GLM53CTL_HEARTBEAT_S": "0"}
    p = subprocess.Popen(
        [sys.executable, "-m", "glm53ctl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in p.stderr:
            lines.append(line)
            if after in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(120), "".join(lines)
        time.sleep(settle_s)
        assert p.poll() is None, "the run ended before the signal: " + "".join(lines)
        t0 = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)
        code = p.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    reader.join(10)
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(mark), f"processes left: {_marked(mark)}"
    assert not list(tmp.iterdir()), f"temporary files left: {list(tmp.iterdir())}"
    return code, "".join(lines), took


def _stopped(code: int, err: str, took: float, sig: signal.Signals, what: str) -> None:
    assert code == 128 + sig.value, err  # 130 for SIGINT, 143 for SIGTERM
    assert f"Error: interrupted ({sig.name}): " in err and what in err, err
    assert "Traceback" not in err, err
    assert took < 15, f"{took:.1f} s from the signal to the end"


SIGNALS = [signal.SIGINT, signal.SIGTERM]


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_check_stops_its_workers_at_once(tmp_path, sig):
    args = ["check", "--kind", "kda,sparse", "--jobs", "2"]
    code, err, took = _interrupt(tmp_path, args, sig, after="checking 8 keys")
    _stopped(code, err, took, sig, "of 8 keys checked")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_fault_stops_its_workers_at_once(tmp_path, sig):
    args = ["fault", "--kind", "kda", "--tp", "1,2", "--rows", "1,8", "--jobs", "2"]
    code, err, took = _interrupt(tmp_path, args, sig, after="sticking ")
    _stopped(code, err, took, sig, "of 4 keys fault-tested")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_build_stops_its_compilers_and_keeps_what_finished(tmp_path, sig):
    out = tmp_path / "build"
    args = ["build", "--kind", "dense,kda,sparse", "-o", str(out), "--jobs", "2"]
    code, err, took = _interrupt(tmp_path, args, sig, after="] built ", settle_s=1.0)
    _stopped(code, err, took, sig, "keys built, kept in")
    assert not (out / "manifest.json").exists()  # a manifest of some keys would pass for the whole build
    assert list((out / "cache").glob("*.json"))  # what finished is kept: a rerun takes it free


def _whole_or_gone(cache: Path) -> None:
    """Every worktree left in `cache` is whole (the cache, reused next time) and known to git."""
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    for tree in (cache / "worktrees").glob("*"):
        assert str(tree.resolve()) in listed and (tree / "glm53ctl" / "cli.py").is_file()


def _forget_worktrees(cache: Path) -> None:
    """Never leave a worktree registered in the developer's checkout."""
    for left in (cache / "worktrees").glob("*"):
        subprocess.run(["git", "worktree", "remove", "--force", str(left)], cwd=ROOT, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)


def test_check_against_stops_the_refs_process_and_leaves_no_folder(tmp_path):
    """SIGTERM while REF's glm53ctl computes its outputs (in a session of its own): it and its folder go too; the
    ref's worktree is either whole (the cache, reused next time) or gone."""
    cache = tmp_path / "cache"
    args = ["check", "--kind", "kda,sparse", "--against", "HEAD", "--worktrees", str(cache)]
    try:
        code, err, took = _interrupt(tmp_path, args, signal.SIGTERM, after="running HEAD", settle_s=6.0)
        _stopped(code, err, took, signal.SIGTERM, "while HEAD computed its outputs")
        _whole_or_gone(cache)
    finally:
        _forget_worktrees(cache)


def test_report_stops_its_part_and_keeps_the_parts_that_finished(tmp_path):
    """Ctrl-C while `report`'s second part runs: the part's process and its workers go at once, the report of the
    first part stays written, no temporary folder is left, and REF's worktree is whole or gone."""
    cache, out = tmp_path / "cache", tmp_path / "report"
    args = ["report", "--against", "HEAD", "--kind", "embed,kda", "--tp", "1", "--rows", "1"]
    args += ["--parts", "build,check", "--out", str(out), "--worktrees", str(cache)]
    try:
        code, err, took = _interrupt(tmp_path, args, signal.SIGINT, after="report: part 2 of 2, check", settle_s=6.0)
        _stopped(code, err, took, signal.SIGINT, f"1 of 2 parts reported in {out}")
        doc = json.loads((out / "report.json").read_text())
        assert list(doc["parts"]) == ["build"] and doc["parts"]["build"]["status"] == "passed"
        _whole_or_gone(cache)
    finally:
        _forget_worktrees(cache)


def test_an_error_the_stop_causes_is_said_as_the_stop(monkeypatch, capsys):
    """A signal that lands inside a lazy import leaves the module half made, and the next import of it raises
    something else (numpy: "CPU dispatcher tracer already initlized"): after SIGTERM, any error is the stop's,
    one line and 143, no traceback; before any signal the same error is a bug and propagates."""
    from glm53ctl import cli, interrupts

    def broken(**_):
        raise RuntimeError("CPU dispatcher tracer already initlized")

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(RuntimeError):
        cli._run(["check"])
    monkeypatch.setattr(interrupts, "_received", ["SIGTERM"])
    assert cli._run(["check"]) == 143
    err = capsys.readouterr().err
    assert "Error: interrupted (SIGTERM)" in err and "Traceback" not in err and "dispatcher" not in err
