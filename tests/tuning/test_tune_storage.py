"""tune.search on real storage with real processes: a study killed mid-way (SIGKILL) resumes without losing a
finished trial; two worker processes share one study through a journal file and through a PostgreSQL server
this module starts; workers that start together enqueue the default once. The evaluator is the synthetic one
(tests/tuning/synthetic.py); the workers are tests/tuning/tune_storage_worker.py in child Pythons."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from glm53ctl.tuning.tune import search, storage_of
from tests.tuning.synthetic import SyntheticEvaluator
from tests.tuning.tune_storage_worker import DEFAULT, SPACE, true_us

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("tune_storage_worker.py")
PG_BIN = Path("/usr/lib/postgresql/15/bin")

pytestmark = pytest.mark.slow


# --- helpers -------------------------------------------------------------------------------------------------


def _states():
    from optuna.trial import TrialState

    return TrialState


def _finished(study) -> list:
    ts = _states()
    return [t for t in study.get_trials(deepcopy=False) if t.state in (ts.COMPLETE, ts.PRUNED)]


def _load(storage, name):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _spawn(
    storage: str,
    name: str,
    trials: int,
    *,
    sleep: float,
    seed: int,
    go: Path | None = None,
    holds: dict[str, Path] | None = None,
    samples: int = 3,
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(WORKER),
        storage,
        name,
        str(trials),
        "--sleep",
        str(sleep),
        "--seed",
        str(seed),
        "--samples",
        str(samples),
    ]
    if go is not None:
        cmd += ["--go", str(go)]
    for what, folder in (holds or {}).items():
        cmd += [f"--hold-{what}", str(folder)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_two(
    tmp_path: Path,
    storage: str,
    name: str,
    trials: int,
    *,
    sleep: float,
    staggered: bool = False,
    holds: tuple[str, ...] = (),
):
    """Two workers on one study, each released once it has imported everything: together, or (`staggered`) the
    second once the first has finished its first trial (the default), so that it joins a study under way.
    `holds`: the worker's --hold-* races to make certain. (returncode, trial numbers it finished, stderr) per
    worker."""
    tag = uuid.uuid4().hex[:6]
    go = [tmp_path / f"go-{tag}-{i}" for i in range(2)]
    folders = {}
    for what in holds:
        folders[what] = tmp_path / f"hold-{what}-{tag}"
        folders[what].mkdir()
    procs = [
        _spawn(storage, name, trials, sleep=sleep, seed=seed, go=g, holds=folders)
        for seed, g in zip((1, 2), go, strict=True)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("READY"), f"worker did not start: {line!r}\n{p.stderr.read()}"
        early = ""
        go[0].touch()
        if staggered:
            early = procs[0].stdout.readline()
            assert early.startswith("TRIAL "), f"the first worker finished no trial: {early!r}"
        go[1].touch()
        out = []
        for p, head in zip(procs, (early, ""), strict=True):
            stdout, stderr = p.communicate(timeout=90)
            numbers = [int(ln.split()[1]) for ln in (head + stdout).splitlines() if ln.startswith("TRIAL ")]
            out.append((p.returncode, numbers, stderr))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _check_shared_study(study, workers, trials: int, raced: bool = False) -> None:
    """What two workers sharing one study of `trials` must leave. `raced`: the workers were held so that both
    found the study empty; then one of them may have waited out the other's whole run, and the default need
    not be trial 0, but it is still there once, finished."""
    ts = _states()
    for rc, _, err in workers:
        assert rc == 0, f"a worker failed (rc {rc}):\n{err[-3000:]}"
    finished = _finished(study)
    numbers = sorted(t.number for t in finished)
    # every trial finished, none left running or waiting
    assert [(t.number, t.state.name) for t in study.trials if t.state not in (ts.COMPLETE, ts.PRUNED)] == []
    # MaxTrialsCallback is checked by each worker after its own trial: the worker that did not finish the
    # `trials`-th trial was mid-trial then and finishes that one too, so two workers may end one over
    assert trials <= len(finished) <= trials + 1, numbers
    # no two workers ran the same trial, and together they ran them all; both ran some
    (_, a, _), (_, b, _) = workers
    assert not set(a) & set(b), (a, b)
    assert sorted(a + b) == numbers
    if not raced:
        assert a and b, f"one worker ran no trial: {a} {b}"
    # the default: enqueued (flagged) once, finished; trial 0
    defaults = [t for t in study.trials if t.user_attrs.get("default")]
    assert defaults, "no trial is the default's"
    assert len(defaults) == 1, f"the default was enqueued {len(defaults)} times: trials {[t.number for t in defaults]}"
    assert defaults[0].params == DEFAULT and defaults[0].state == ts.COMPLETE
    if not raced:
        assert defaults[0].number == 0


# --- 1. a killed study resumes ---------------------------------------------------------------------------------


def test_killed_study_resumes_without_losing_finished_trials(tmp_path):
    ts = _states()
    url = f"sqlite:///{tmp_path / 'study.db'}"
    name, trials = "resume", 12
    storage = storage_of(url)  # the schema, before the child opens the file
    # each trial 3 samples of ~0.07 s: ~0.2 s
    child = _spawn(url, name, trials, sleep=0.07, seed=1)
    try:
        deadline = time.monotonic() + 60
        complete = []
        while time.monotonic() < deadline:
            assert child.poll() is None, f"the worker ended before it was killed:\n{child.stderr.read()}"
            try:
                sid = storage.get_study_id_from_name(name)
            except KeyError:
                sid = None
            if sid is not None:
                complete = storage.get_all_trials(sid, deepcopy=False, states=(ts.COMPLETE,))
                if len(complete) >= 3:
                    break
            time.sleep(0.02)
        assert len(complete) >= 3, "the worker finished no 3 trials in 60 s"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    before = {t.number: (t.state, t.params, t.value) for t in _finished(_load(storage_of(url), name))}
    assert 3 <= len(before) < trials, f"killed too late to prove a resume: {sorted(before)}"
    assert before[0][1] == DEFAULT

    ev = SyntheticEvaluator(true_us, seed=7)
    seen = []
    study = search(
        ev,
        DEFAULT,
        SPACE,
        storage_of(url),
        name,
        trials,
        seed=1,
        samples=3,
        on_trial=lambda s, t: seen.append(t.number),
    )

    after = {t.number: (t.state, t.params, t.value) for t in _finished(study)}
    # every trial finished before the kill is there, unchanged
    for n, rec in before.items():
        assert after.get(n) == rec, f"trial {n}: {rec} before the kill, {after.get(n)} after the resume"
    # exactly `trials` finished in all; the resumed run added the rest, after the killed run's trials
    assert len(after) == trials, sorted(after)
    assert len(seen) == trials - len(before)
    assert sorted(seen) == sorted(set(after) - set(before))
    assert min(seen) > max(before)
    # the default: trial 0, enqueued once, not timed again by the resumed run
    defaults = [t.number for t in study.trials if t.user_attrs.get("default")]
    assert defaults == [0]
    assert study.trials[0].params == DEFAULT and study.trials[0].state == ts.COMPLETE
    assert DEFAULT not in ev.timed
    # a trial the kill cut short is left RUNNING (its heartbeat grace is 120 s), never counted
    cut = [t for t in study.trials if t.state not in (ts.COMPLETE, ts.PRUNED)]
    assert all(t.state == ts.RUNNING and t.number not in after for t in cut), cut
    assert len(cut) <= 1


# --- 2. two workers, one journal file --------------------------------------------------------------------------


def test_two_workers_share_a_journal_study(tmp_path):
    path = str(tmp_path / "study.log")
    workers = _run_two(tmp_path, path, "shared", 10, sleep=0.03, staggered=True)
    _check_shared_study(_load(storage_of(path), "shared"), workers, 10)


# --- 3. two workers, one PostgreSQL database ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL 15 server on a unix socket only, trust auth, run as the `postgres` user when the tests run as
    root (the server refuses root); a function that makes a fresh database and returns its URL."""
    tools = [PG_BIN / t for t in ("initdb", "pg_ctl", "createdb", "postgres")]
    missing = [str(t) for t in tools if not t.exists()]
    if missing:
        pytest.skip(f"PostgreSQL 15 binaries missing: {', '.join(missing)}")
    prefix: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("no `postgres` system user to run the server as (it refuses to run as root)")
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("no runuser to run the server as the `postgres` user")
        prefix = [runuser, "-u", "postgres", "--"]

    base = Path(tempfile.mkdtemp(prefix="tune-pg-", dir="/tmp"))
    data, sock, log = base / "data", base / "s", base / "server.log"
    sock.mkdir()
    if owner is not None:
        for p in (base, sock):
            os.chown(p, owner.pw_uid, owner.pw_gid)
    port = _free_port()

    def pg(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([*prefix, *args], cwd=base, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            server_log = log.read_text() if log.exists() else ""
            raise RuntimeError(f"{' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}\n{server_log}")
        return r

    started = False
    try:
        pg(
            str(PG_BIN / "initdb"),
            "-D",
            str(data),
            "--auth=trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        opts = f"-k {sock} -c listen_addresses='' -p {port} -c fsync=off -c max_connections=100"
        started = True
        pg(str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", opts, "start")
        made = []

        def database() -> str:
            db = f"tune_{len(made)}_{uuid.uuid4().hex[:6]}"
            pg(str(PG_BIN / "createdb"), "-h", str(sock), "-p", str(port), "-U", "postgres", db)
            made.append(db)
            return f"postgresql+psycopg2://postgres@/{db}?host={sock}&port={port}"

        yield database
    finally:
        if started:
            pg(str(PG_BIN / "pg_ctl"), "-D", str(data), "stop", "-m", "immediate", "-w", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_two_workers_share_a_postgres_study(tmp_path, postgres):
    # a fresh database: the first worker makes the tables and the study, the second joins it
    url = postgres()
    workers = _run_two(tmp_path, url, "shared", 10, sleep=0.03, staggered=True)
    _check_shared_study(_load(storage_of(url), "shared"), workers, 10)


# --- 4. workers that start together ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["journal", "postgres"])
def test_workers_starting_together_enqueue_the_default_once(tmp_path, request, backend):
    """Each worker, once it goes to enqueue the default, waits (up to 3 s) for the other to get there too: the
    interleaving where both found the study empty, made certain rather than left to chance. A search that
    enqueues the default once must leave one default trial however the workers interleave."""
    if backend == "journal":
        storage = str(tmp_path / "study.log")
    else:
        storage = request.getfixturevalue("postgres")()
        storage_of(storage)  # the tables first: this test is about the study, not the schema
    workers = _run_two(tmp_path, storage, "race", 4, sleep=0.01, holds=("enqueue",))
    _check_shared_study(_load(storage_of(storage), "race"), workers, 4, raced=True)


def test_workers_starting_together_on_a_fresh_postgres_database(tmp_path, postgres):
    """Both workers reach the making of the tables together (each waits, up to 3 s, for the other before
    SQLAlchemy's create_all): both must open the storage and finish the study (the default's enqueueing is
    the test above's)."""
    url = postgres()
    workers = _run_two(tmp_path, url, "fresh", 4, sleep=0.01, holds=("schema",))
    for rc, _, err in workers:
        assert rc == 0, f"a worker failed on a fresh database (rc {rc}):\n{err[-3000:]}"
    finished = _finished(_load(storage_of(url), "fresh"))
    assert 4 <= len(finished) <= 5
