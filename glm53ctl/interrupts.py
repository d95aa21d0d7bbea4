"""How a command stops early: Ctrl-C (SIGINT) and SIGTERM end it at once, its workers and child processes with it.

Both signals raise KeyboardInterrupt in the main process (`install`), so one path unwinds everything: `with`
blocks remove their temporary folders, `worker_pool` kills its workers, `run_group` kills a child and the
processes it started. The command then raises `interrupted(...)`: "interrupted (SIGTERM): 3 of 12 keys checked"
on stderr and exit 128 + the signal's number (130 for SIGINT, 143 for SIGTERM). Workers ignore SIGINT: a
terminal sends it to the whole process group, and a worker's traceback would only bury the parent's one line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from glm53ctl.errors import Interrupted

_received: list[str] = []  # the signals that reached this process, by name

# first in a worker's initializer code (a string: it runs before the worker imports any glm53ctl)
# a worker ignores SIGINT (the command stops it), and dies with the command (Linux: PR_SET_PDEATHSIG), so a
# command killed outright (SIGKILL, a test's timeout) leaves no worker spinning in a hung launch
WORKER_INIT = """import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
"""


def _raise(signum, frame) -> None:
    _received.append(signal.Signals(signum).name)
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt here (the main thread of the command's process)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _raise)


def stopped() -> bool:
    """Whether SIGINT or SIGTERM has reached this process: any error after it is the stop's own (an import the
    signal cut in half fails again when retried, a pipe to a killed child breaks), not one to report apart."""
    return bool(_received)


def interrupted(done: str | None = None) -> Interrupted:
    """The error a command raises once its work is stopped: which signal, and what finished."""
    by = _received[-1] if _received else "SIGINT"
    code = 128 + signal.Signals[by].value
    return Interrupted(f"interrupted ({by})" + (f": {done}" if done else ""), exit_code=code)


@contextmanager
def worker_pool(jobs: int, init_code: str) -> Iterator:
    """A ProcessPoolExecutor of `jobs` spawned workers, each running WORKER_INIT + `init_code` first, their
    temporary files (theirs and their tools', ptxas's) in a folder of their own, removed after them. Leaving the
    block by an exception (an interrupt) kills the workers and what they started at once: a worker mid-key would
    otherwise run it to its end (minutes under the interpreter) and `shutdown` would wait for it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    tmp = tempfile.mkdtemp(prefix="glm53ctl-workers-")
    private = f"import os, tempfile\nos.environ['TMPDIR'] = tempfile.tempdir = {tmp!r}\n"
    spawn = multiprocessing.get_context("spawn")
    init = WORKER_INIT + private + init_code
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=spawn, initializer=exec, initargs=(init, {}))
        try:
            yield pool
        except BaseException:
            kill_workers(pool)
            raise
        pool.shutdown(wait=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def kill_workers(pool) -> None:
    """SIGKILL every worker of a ProcessPoolExecutor and every process it started, then reap the workers (the
    executor names no public way)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    doomed = [q for p in procs if p.pid for q in _descendants(p.pid)] + [p.pid for p in procs if p.pid]
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        p.join(timeout=5)


def _descendants(pid: int) -> list[int]:
    """The processes under `pid`, deepest first (Linux /proc; none elsewhere)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for c in kids:
            out += _descendants(c) + [c]
    return out


def run_group(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` in a session of its own, killed with everything it started (a ref's glm53ctl and its
    workers) when this process is interrupted (the group is killed before the child is reaped: its id is not
    anybody else's yet). Its temporary files (its own, its workers', its tools') go into a folder of its own,
    removed after it: a killed child leaves none behind."""
    tmp = tempfile.mkdtemp(prefix="glm53ctl-child-")
    env = (kwargs.pop("env", None) or os.environ) | {"TMPDIR": tmp}
    try:
        p = subprocess.Popen(args, start_new_session=True, env=env, **kwargs)
        try:
            out, err = p.communicate()
        except BaseException:
            _stop_group(p)
            raise
        return subprocess.CompletedProcess(args, p.returncode, out, err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_group(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    """The child's session stopped: SIGTERM first, so that a child that runs children of its own in sessions of
    theirs (`report` runs `check`, which runs REF's glm53ctl) stops them as it goes, then SIGKILL to whatever of
    the group is left. SIGKILL alone orphaned the grandchildren: they ran on into folders already removed."""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:  # the leader's exit waited for, not reaped: the group's id stays its own
        if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break
        time.sleep(0.05)
    _kill_group(p.pid)
    p.wait()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def whole_line(text: str) -> None:
    """A line on stderr in one write(2): workers writing at once never run their lines together (a write of
    under PIPE_BUF bytes is atomic on a pipe; a terminal takes it whole too), as a print's pieces might."""
    sys.stderr.flush()
    data = (text + "\n").encode(errors="replace")
    while data:
        data = data[os.write(sys.stderr.fileno(), data) :]
